// Job view (#/jobs/<name>): the job's state (since when and why; when it ended), what it
// can carry out (in-process under NVRx's Wrapper or not, which launcher), its generation
// (attempt, in-process iteration), step
// time per rank as a heatmap over time and the cohort's median and worst rank as a line
// chart, straggler scores and flags, the ranks, goodput with its badput breakdown over
// time, the checkpoint-interval advice, its incidents and events, and a restart control
// (operator; confirmation with a level the job supports and a reason; a 202 leads to the
// new incident, a 409 is shown in the dialog with the server's reason).
// Loaded from GET /jobs/<job>, /steps, /stragglers, /goodput, /advice, /incidents; the
// steps are read incrementally on each `nodes` tick of the live stream (every 2 s), the
// rest every 10 s and whenever an event of this job arrives.
import { apiGet, apiPost } from "../api.js";
import { confirmDialog } from "../components/confirm-dialog.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { GOODPUT_PARTS, GoodputChart } from "../components/goodput-chart.js";
import { StepHeatmap } from "../components/heatmap.js";
import { StepChart } from "../components/step-chart.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import {
  duration,
  fraction,
  jobEnded,
  jobLabel,
  jobState,
  jobStateBadge,
  timeEl,
} from "../lib/format.js";
import { factItems, failure, table } from "../lib/panels.js";
import { StepMatrix } from "../lib/steps.js";
import { reachedPhase } from "./overview.js";

export const title = (params) => params.name;

const MAX_COLUMNS = 300; // steps kept in the heatmap
const OVERLAP_S = 10; // re-read this much before the newest step (batches arrive out of order)
const DETAILS_EVERY_S = 10;
const MAX_STRAGGLER_ROWS = 25;

const LEVELS = [
  ["in_process", "in-process: the NVRx Wrapper re-enters the training function (seconds)"],
  ["launcher", "launcher: workers end, the launcher respawns them from the checkpoint"],
];

const LAUNCHER_TEXT = {
  torchrun: "torchrun",
  ft_launcher: "ft_launcher (NVRx)",
  slurm: "Slurm",
  none: "none",
};

/** The levels the job can carry out ([] for none); every level on a server that does not say. */
export function restartLevels(job) {
  const levels = job?.capabilities?.levels;
  return Array.isArray(levels) ? LEVELS.filter(([level]) => levels.includes(level)) : LEVELS;
}

/** Why a level is not offered, for the dialog and the page. */
function missingLevels(job) {
  const caps = job?.capabilities;
  if (!caps || !Array.isArray(caps.levels)) return [];
  const out = [];
  if (!caps.levels.includes("in_process")) {
    out.push("In-process is not offered: not every live rank runs under NVRx's Wrapper.");
  }
  if (!caps.levels.includes("launcher")) {
    out.push("Launcher is not offered: no launcher (torchrun, ft_launcher, Slurm) would respawn the ranks.");
  }
  return out;
}

const hasLive = (job) => (job.ranks ?? []).some((r) => r.alive);

/** What the ranks declared, alive or not (a job without live ranks: its last ranks). */
function declared(job) {
  const ranks = job.ranks ?? [];
  const flags = ranks.map((r) => r.in_process).filter((v) => v !== null && v !== undefined);
  return {
    inProcess: flags.length ? flags.every(Boolean) : null,
    launchers: [...new Set(ranks.map((r) => r.launcher).filter(Boolean))].sort(),
  };
}

function inProcessText(job) {
  const caps = job.capabilities;
  if (!caps) return h("span", { class: "muted" }, "not reported by this server");
  const live = hasLive(job);
  const value = live ? caps.in_process : declared(job).inProcess;
  const of = live ? "every live rank runs" : "its last ranks ran";
  if (value === true) return h("span", { class: "cap cap-yes" }, `yes: ${of} under NVRx's Wrapper`);
  if (value === false) {
    const who = live ? "not every live rank runs" : "not every one of its last ranks ran";
    return h("span", { class: "cap cap-no" }, `no: ${who} under NVRx's Wrapper`);
  }
  return h("span", { class: "muted" }, live ? "unknown: the ranks did not declare it (an older SDK)" : "unknown: no live rank");
}

function launcherText(job) {
  if (!job.capabilities) return h("span", { class: "muted" }, "not reported by this server");
  const launchers = hasLive(job) ? job.capabilities.launchers : declared(job).launchers;
  if (!launchers?.length) return h("span", { class: "muted" }, "unknown");
  return launchers.map((l) => LAUNCHER_TEXT[l] ?? l).join(", ");
}

function levelsText(job) {
  if (!hasLive(job) && job.capabilities) return h("span", { class: "muted" }, "none: no live rank to restart");
  const levels = restartLevels(job);
  return levels.length ? levels.map(([l]) => l.replace("_", "-")).join(", ") : "none";
}

function score(v) {
  return v === null || v === undefined ? "\u2014" : Number(v).toFixed(2);
}

function runsUnder(rank) {
  const wrapper =
    rank.in_process === true ? "Wrapper" : rank.in_process === false ? "no Wrapper" : null;
  const launcher = rank.launcher ?? null; // the bare name: the table is narrow
  if (!wrapper && !launcher) return h("span", { class: "muted" }, "\u2014");
  return [
    wrapper ? h("span", { class: rank.in_process ? "cap-yes" : "cap-no", dataset: { field: "in-process" } }, wrapper) : null,
    wrapper && launcher ? " \u00b7 " : null,
    launcher ? h("span", { dataset: { field: "launcher" } }, launcher) : null,
  ];
}

export function mount(root, ctx) {
  const name = ctx.params.name;
  const enc = encodeURIComponent(name);
  ctx.stream.setTopics(["nodes", "events", "incidents", `job:${name}`]);

  const restartButton = h("button", { type: "button", class: "btn btn-danger", id: "restart-job", "aria-describedby": "restart-note" }, "Restart\u2026");
  const restartNote = h("span", { class: "muted restart-note", id: "restart-note" });
  const heading = h("h1", {}, name);
  const stateSlot = h("span", { class: "state-slot" });
  const facts = h("dl", { class: "facts" }, h("p", { class: "muted" }, "Loading the job\u2026"));
  const capsList = h("dl", { class: "caps-facts", id: "capabilities" });
  const modeSelect = h(
    "select",
    { id: "heatmap-mode" },
    h("option", { value: "relative" }, "relative to the step's median"),
    h("option", { value: "absolute" }, "absolute time"),
  );
  const stepsStatus = h("div");
  const heatmapRoot = h("div", { class: "heatmap", id: "step-heatmap" });
  const stepChartRoot = h("div", { class: "chart-root", id: "step-chart" });
  const stragglerMeta = h("p", { class: "muted note" });
  const stragglerRoot = h("div", {}, h("p", { class: "muted" }, "Loading stragglers\u2026"));
  const ranksRoot = h("div", {}, h("p", { class: "muted" }, "Loading ranks\u2026"));
  const windowSelect = h(
    "select",
    { id: "goodput-window" },
    h("option", { value: "1h" }, "last hour"),
    h("option", { value: "24h", selected: true }, "last 24 h"),
    h("option", { value: "all" }, "whole job"),
  );
  const goodputRoot = h("div", {}, h("p", { class: "muted" }, "Loading goodput\u2026"));
  const goodputChartRoot = h("div", { class: "chart-root", id: "goodput-chart" });
  const adviceRoot = h("div", {}, h("p", { class: "muted" }, "Loading advice\u2026"));
  const incidentsRoot = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
  const feedRoot = h("div");

  const panel = (id, heading, ...children) =>
    h("section", { class: "panel", "aria-labelledby": id }, h("div", { class: "panel-head" }, h("h2", { id }, heading), ...children.slice(0, 1)), ...children.slice(1));

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", name),
    h("div", { class: "title-row" }, heading, stateSlot, h("span", { class: "spacer" }), restartNote, restartButton),
    facts,
    h(
      "section",
      { class: "panel caps-panel", "aria-labelledby": "caps-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "caps-heading" }, "What the job can carry out")),
      h("p", { class: "muted note" }, "As its live ranks declared it through the trainguard SDK; the engine and the restart control use only these levels."),
      capsList,
    ),
    panel(
      "steps-heading",
      "Step time per rank",
      h("div", { class: "filters" }, h("label", { for: "heatmap-mode" }, "Colour"), modeSelect),
      stepsStatus,
      heatmapRoot,
      h("h3", { class: "sub-heading" }, "Median and worst rank per step"),
      stepChartRoot,
    ),
    h(
      "div",
      { class: "two-col" },
      panel("stragglers-heading", "Stragglers", stragglerMeta, stragglerRoot),
      panel("ranks-heading", "Ranks", null, ranksRoot),
    ),
    panel(
      "goodput-heading",
      "Goodput",
      h("div", { class: "filters" }, h("label", { for: "goodput-window" }, "Window"), windowSelect),
      goodputRoot,
      goodputChartRoot,
    ),
    h(
      "div",
      { class: "two-col" },
      panel("advice-heading", "Checkpoint interval", null, adviceRoot),
      panel("job-incidents-heading", "Incidents", h("a", { href: `#/incidents?job=${enc}` }, "all of this job's"), incidentsRoot),
    ),
    panel("job-events-heading", "Events of this job", null, feedRoot),
  );

  const matrix = new StepMatrix({ maxColumns: MAX_COLUMNS });
  const heatmap = new StepHeatmap(heatmapRoot);
  const stepChart = new StepChart(stepChartRoot);
  const goodputChart = new GoodputChart(goodputChartRoot);
  let job = null;
  let flagged = new Set();
  let stepsLoading = false;
  let detailsReadAt = 0;

  // --- the job ------------------------------------------------------------------------

  function showJob(j) {
    job = j;
    const state = jobState(j);
    const label = jobLabel(j);
    replace(heading, label, label !== j.name ? h("span", { class: "muted job-id mono" }, j.name) : null);
    replace(stateSlot, jobStateBadge(j, { withEnd: false }));
    stateSlot.dataset.state = state;
    const ended = jobEnded(j);
    replace(
      facts,
      factItems([
        j.state_since ? [`${state} since`, h("span", { dataset: { field: "state-since" } }, timeEl(j.state_since))] : null,
        j.state_reason ? ["Why", h("span", { dataset: { field: "state-reason" } }, j.state_reason)] : null,
        ended ? ["Ended", h("span", { dataset: { field: "ended" } }, timeEl(j.ended_at))] : null,
        ["World size", String(j.world_size ?? "\u2014")],
        ["Attempt", h("span", { title: "launcher-level restarts so far", dataset: { field: "attempt" } }, String(j.attempt ?? 0))],
        ["Iteration", h("span", { title: "in-process restarts within this attempt", dataset: { field: "iteration" } }, String(j.iteration ?? 0))],
        ["Last step", String(j.last_step ?? "\u2014")],
        ["Last seen", timeEl(j.last_seen)],
        ["First seen", timeEl(j.first_seen)],
      ]),
    );
    replace(
      capsList,
      factItems([
        ["In-process restart", h("span", { dataset: { field: "in-process" } }, inProcessText(j))],
        ["Launcher", h("span", { dataset: { field: "launchers" } }, launcherText(j))],
        [
          "Restart levels",
          h("span", { dataset: { field: "levels", levels: restartLevels(j).map(([l]) => l).join(",") } }, levelsText(j)),
        ],
      ]),
    );
    // The restart control says why it is not offered rather than failing on a click.
    let why = "";
    if (ended && !hasLive(j)) why = `The job has ${state}: there is nothing to restart.`;
    else if (!restartLevels(j).length) why = "No restart level: the ranks run under no launcher and not under NVRx's Wrapper.";
    restartButton.disabled = Boolean(why);
    restartNote.textContent = why;
    showRanks(j.ranks ?? []);
  }

  function showRanks(ranks) {
    if (!ranks.length) {
      replace(ranksRoot, emptyState("No rank has reported."));
      return;
    }
    const ordered = [...ranks].sort((a, b) => Number(a.alive) - Number(b.alive) || a.rank - b.rank);
    // What each rank runs under, only when they differ (else the capabilities say it):
    // then it names the ranks that keep the job from in-process restarts.
    const mixed = new Set(ranks.map((r) => `${r.in_process}|${r.launcher}`)).size > 1;
    ranksRoot.dataset.mixed = String(mixed);
    replace(
      ranksRoot,
      h(
        "div",
        { class: "table-scroll tall-scroll" },
        table(
          "ranks-table",
          ["Rank", "Node", "Local", "PID", "Attempt", "Iter", "Last step", "Alive", mixed ? "Runs under" : null, "Heartbeat"].filter(Boolean),
          h(
            "tbody",
            {},
            ordered.map((r) =>
              h(
                "tr",
                { dataset: { rank: String(r.rank), alive: String(r.alive) } },
                h("th", { scope: "row", class: "num" }, String(r.rank)),
                h("td", {}, h("a", { href: `#/nodes/${encodeURIComponent(r.node)}` }, r.node)),
                h("td", { class: "num" }, String(r.local_rank ?? "\u2014")),
                h("td", { class: "num mono" }, String(r.pid ?? "\u2014")),
                h("td", { class: "num" }, String(r.attempt ?? 0)),
                h("td", { class: "num" }, String(r.iteration ?? 0)),
                h("td", { class: "num" }, r.last_step ?? "\u2014"),
                h("td", {}, r.alive ? "yes" : h("strong", { class: "bad" }, "no")),
                mixed ? h("td", { title: "what the rank declared: NVRx's in-process Wrapper, and its launcher" }, runsUnder(r)) : null,
                h("td", {}, timeEl(r.last_heartbeat)),
              ),
            ),
          ),
          [0, 2, 3, 4, 5, 6],
        ),
      ),
    );
  }

  async function loadJob() {
    try {
      showJob(await apiGet(`jobs/${enc}`, {}, { signal: ctx.signal }));
      return true;
    } catch (error) {
      if (error.name === "AbortError") return false;
      if (error.status === 404 && !/^Not Found$/.test(error.detail)) {
        replace(facts, emptyState(`Job "${name}" has not reported to this server.`));
        replace(capsList);
        restartButton.disabled = true;
        return false;
      }
      replace(facts, errorBox("Could not load the job", error));
      return false;
    }
  }

  // --- steps: heatmap and line chart ------------------------------------------------

  function drawSteps() {
    const started = performance.now();
    const built = matrix.build();
    heatmap.setData(built, flagged);
    stepChart.setData(built);
    // How long building and drawing the steps took (read by the benchmark).
    heatmapRoot.dataset.drawMs = (performance.now() - started).toFixed(1);
    if (!performance.getEntriesByName("trainguard:job-steps").length && built.columns.length) {
      requestAnimationFrame(() => performance.mark("trainguard:job-steps"));
    }
    replace(
      stepsStatus,
      built.columns.length
        ? null
        : emptyState("No step has been reported yet (the training script reports steps through the trainguard SDK)."),
    );
  }

  async function loadSteps() {
    if (stepsLoading) return;
    stepsLoading = true;
    try {
      const world = Math.max(job?.world_size ?? 1, 1);
      const first = matrix.lastEnd === null;
      const params = first
        ? { limit: Math.min(100000, Math.max(5000, world * MAX_COLUMNS)) }
        : { since: Math.max(0, matrix.lastEnd - OVERLAP_S), limit: Math.min(100000, Math.max(5000, world * 60)) };
      const answer = await apiGet(`jobs/${enc}/steps`, params, { signal: ctx.signal });
      const added = matrix.add(answer.columns);
      if (first || added) drawSteps();
    } catch (error) {
      if (error.name !== "AbortError") replace(stepsStatus, failure("the steps", error, "Step timings are not available on this server."));
    } finally {
      stepsLoading = false;
    }
  }

  modeSelect.addEventListener("change", () => heatmap.setMode(modeSelect.value));

  // --- stragglers ---------------------------------------------------------------------

  async function loadStragglers() {
    try {
      const answer = await apiGet(`jobs/${enc}/stragglers`, {}, { signal: ctx.signal });
      const ranks = [...(answer.ranks ?? [])];
      flagged = new Set(ranks.filter((r) => r.flagged).map((r) => r.rank));
      replace(
        stragglerMeta,
        `relative score: the fastest ranks' step time / the rank's, over windows of ${answer.window_steps ?? "?"} steps; ` +
          `flagged while it stays below ${answer.threshold ?? "?"}`,
      );
      // Flagged first, then the slowest (lowest relative score); unscored ranks last.
      const rel = (r) => r.relative_score ?? Infinity;
      ranks.sort((a, b) => Number(b.flagged) - Number(a.flagged) || rel(a) - rel(b) || a.rank - b.rank);
      const shown = ranks.slice(0, Math.max(MAX_STRAGGLER_ROWS, flagged.size));
      replace(
        stragglerRoot,
        ranks.length === 0
          ? emptyState("Not enough steps yet to score the ranks.")
          : [
              h(
                "p",
                { class: flagged.size ? "bad" : "muted" },
                flagged.size ? `${flagged.size} rank${flagged.size === 1 ? "" : "s"} flagged` : "No rank is flagged.",
              ),
              h(
                "div",
                { class: "table-scroll tall-scroll" },
                table(
                  "stragglers-table",
                  ["Rank", "Node", "Relative", "Individual", "Median step", "Flagged"],
                  h(
                    "tbody",
                    {},
                    shown.map((r) =>
                      h(
                        "tr",
                        { dataset: { rank: String(r.rank), flagged: String(Boolean(r.flagged)) } },
                        h("th", { scope: "row", class: "num" }, String(r.rank)),
                        h("td", {}, r.node ? h("a", { href: `#/nodes/${encodeURIComponent(r.node)}` }, r.node) : "\u2014"),
                        h("td", { class: "num", title: "the fastest ranks' step time / this rank's (1 = as fast; lower is slower)" }, score(r.relative_score)),
                        h("td", { class: "num", title: "this rank's best window / its current one (lower: it slowed down)" }, score(r.individual_score)),
                        h("td", { class: "num" }, duration(r.median_step_s)),
                        h(
                          "td",
                          {},
                          r.flagged
                            ? h("span", { class: "status status-straggler" }, "flagged ", r.flagged_since ? timeEl(r.flagged_since) : null)
                            : h("span", { class: "muted" }, "no"),
                        ),
                      ),
                    ),
                  ),
                  [0, 2, 3, 4],
                ),
              ),
              ranks.length > shown.length ? h("p", { class: "muted note" }, `${ranks.length - shown.length} more ranks, none flagged.`) : null,
            ],
      );
    } catch (error) {
      if (error.name === "AbortError") return;
      flagged = new Set();
      replace(stragglerMeta);
      replace(stragglerRoot, failure("stragglers", error, "Straggler detection is not available on this server yet."));
    }
  }

  // --- goodput --------------------------------------------------------------------------

  async function loadGoodput() {
    try {
      const g = await apiGet(`jobs/${enc}/goodput`, { window: windowSelect.value }, { signal: ctx.signal });
      const badput = g.badput ?? {};
      const elapsed = g.elapsed_s ?? 0;
      replace(
        goodputRoot,
        h(
          "div",
          { class: "goodput-head" },
          h("p", { class: "goodput-big", dataset: { goodput: String(g.goodput ?? "") } }, fraction(g.goodput)),
          h(
            "p",
            { class: "muted" },
            `productive ${duration(g.productive_s)} of ${duration(elapsed)} of job time`,
          ),
        ),
        h(
          "div",
          { class: "table-scroll" },
          table(
            "badput-table",
            ["", "Part", "Time", "Share"],
            h(
              "tbody",
              {},
              GOODPUT_PARTS.map(([key, label, colour]) => {
                const s = key === "productive" ? g.productive_s : badput[key];
                return h(
                  "tr",
                  { dataset: { part: key } },
                  h("td", {}, h("span", { class: "legend-swatch", style: `background:${colour}` })),
                  h("th", { scope: "row" }, label),
                  h("td", { class: "num" }, duration(s)),
                  h("td", { class: "num" }, elapsed && s !== undefined && s !== null ? fraction(s / elapsed) : "\u2014"),
                );
              }),
            ),
            [2, 3],
          ),
        ),
      );
      goodputChartRoot.hidden = false;
      goodputChart.setData(g.series ?? []);
    } catch (error) {
      if (error.name === "AbortError") return;
      goodputChartRoot.hidden = true;
      replace(goodputRoot, failure("goodput", error, "Goodput accounting is not available on this server yet."));
    }
  }

  windowSelect.addEventListener("change", loadGoodput);

  // --- advice, incidents --------------------------------------------------------------

  async function loadAdvice() {
    try {
      const advice = await apiGet(`jobs/${enc}/advice`, {}, { signal: ctx.signal });
      showAdvice(advice);
    } catch (error) {
      if (error.name === "AbortError") return;
      replace(adviceRoot, failure("the advice", error, "Checkpoint-interval advice is not available on this server yet."));
    }
  }

  function showAdvice(advice) {
    const rec = advice.recommendation ?? {};
    const ckpt = advice.checkpoint ?? {};
    const restart = advice.restart ?? {};
    let headline;
    if (rec.daly_interval_s) {
      headline = h(
        "p",
        { class: "advice-text", dataset: { interval: String(rec.daly_interval_s) } },
        "Checkpoint every ",
        h("strong", {}, duration(rec.daly_interval_s)),
        ` (Daly; Young's first-order estimate: ${duration(rec.young_interval_s)}).`,
        rec.expected_efficiency_recommended !== null && rec.expected_efficiency_recommended !== undefined
          ? ` Expected efficiency ${fraction(rec.expected_efficiency_recommended)}`
          : null,
        rec.expected_efficiency_current !== null && rec.expected_efficiency_current !== undefined
          ? ` against ${fraction(rec.expected_efficiency_current)} at the current ${duration(rec.current_interval_s)}.`
          : ".",
      );
    } else {
      const needs = !ckpt.cost_s
        ? "a measured checkpoint cost (no checkpoint save has been reported)"
        : "a mean time between failures";
      headline = h("p", { class: "advice-text muted" }, `No recommendation yet: it needs ${needs}.`);
    }
    const mtbfText =
      advice.mtbf_s !== null && advice.mtbf_s !== undefined
        ? `${duration(advice.mtbf_s)} (measured)`
        : `> ${duration(advice.mtbf_lower_bound_s)} observed; ${duration(advice.assumed_mtbf_s)} assumed for ${advice.gpus ?? "?"} GPUs`;
    replace(
      adviceRoot,
      headline,
      h(
        "dl",
        { class: "facts" },
        factItems([
          ["MTBF", mtbfText],
          ["Failures", `${advice.failures ?? 0} in ${duration(advice.observed_s)}`],
          ["Checkpoint cost", ckpt.cost_s ? `${duration(ckpt.cost_s)} (${ckpt.saves} saves)` : "not measured"],
          ["Current interval", duration(ckpt.interval_s ?? rec.current_interval_s)],
          ["Restore", duration(ckpt.restore_s)],
          ["Restart (median)", restart.median_s ? `${duration(restart.median_s)} over ${restart.samples}` : "\u2014"],
        ]),
      ),
    );
  }

  async function loadIncidents() {
    try {
      const list = await apiGet("incidents", { job: name, limit: 10 }, { signal: ctx.signal });
      replace(
        incidentsRoot,
        list.length
          ? h(
              "ul",
              { class: "incident-list" },
              list.map((i) =>
                h(
                  "li",
                  { class: "incident-item", dataset: { incident: String(i.id), status: i.status } },
                  h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`),
                  ` ${i.level} \u00b7 ${i.status} \u00b7 `,
                  h("span", { class: "phase" }, reachedPhase(i)),
                  " \u00b7 ",
                  timeEl(i.created_at),
                  i.recovery_s !== null && i.recovery_s !== undefined ? ` \u00b7 recovered in ${duration(i.recovery_s)}` : null,
                ),
              ),
            )
          : emptyState("No incidents for this job."),
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(incidentsRoot, errorBox("Could not load incidents", error));
    }
  }

  async function loadDetails() {
    detailsReadAt = Date.now() / 1000;
    await Promise.all([loadStragglers(), loadGoodput(), loadAdvice(), loadIncidents()]);
    if (matrix.lastEnd !== null) heatmap.setData(matrix.build(), flagged);
  }

  // --- restart --------------------------------------------------------------------------

  restartButton.addEventListener("click", async () => {
    // What the job can carry out now (its ranks may have changed since the last read).
    await loadJob();
    if (ctx.signal.aborted || restartButton.disabled) return;
    const levels = restartLevels(job);
    const result = await confirmDialog({
      title: `Restart ${jobLabel(job) || name}?`,
      text: "Every live rank of the job is restarted at the chosen level. The action is audited with your reason.",
      confirmLabel: "Restart",
      danger: true,
      fields: [
        {
          name: "level",
          label: "Level",
          kind: "select",
          options: levels,
          value: levels[0][0],
          help: missingLevels(job).join(" ") || null,
        },
        { name: "reason", label: "Reason", required: true, placeholder: "why, for the audit log" },
      ],
      signal: ctx.signal,
      action: ({ level, reason }) => apiPost(`jobs/${enc}/restarts`, { level, reason }, { signal: ctx.signal }),
      // A 409: the job cannot carry it out (any more); the page shows what it can now.
      onRefused: (error) => error.status === 409 && loadJob(),
    });
    if (result?.incident_id !== undefined) {
      location.hash = `#/incidents/${result.incident_id}`;
    } else {
      restartButton.focus();
    }
  });

  // --- live -----------------------------------------------------------------------------

  // The steps first: on a large job the analytics answers take longer, and the server
  // serves them one process-wide, so they would hold up the heatmap.
  loadJob()
    .then((found) => (found ? loadSteps() : null))
    .finally(() => {
      if (!ctx.signal.aborted) loadDetails();
    });

  let soon = null;
  const offNodes = ctx.stream.on("nodes", () => {
    if (!job) return;
    loadSteps();
    if (Date.now() / 1000 - detailsReadAt >= DETAILS_EVERY_S) {
      loadJob();
      loadDetails();
    }
  });
  const offEvent = ctx.stream.on("event", (event) => {
    if (event.job !== name) return;
    clearTimeout(soon);
    soon = setTimeout(() => {
      loadJob();
      loadDetails();
    }, 500);
  });
  const offIncident = ctx.stream.on("incident", (incident) => {
    if (!incident?.job || incident.job === name) loadIncidents();
  });
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (reconnected) {
      loadJob();
      loadSteps();
      loadDetails();
    }
  });
  const offFeed = mountEventsFeed(feedRoot, ctx, { job: name, limit: 30 });

  return () => {
    clearTimeout(soon);
    offNodes();
    offEvent();
    offIncident();
    offState();
    offFeed();
    heatmap.destroy();
    stepChart.destroy();
    goodputChart.destroy();
  };
}
