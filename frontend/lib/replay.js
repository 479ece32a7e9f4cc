// The policy replay's report (POST /policy/replay, docs/replay.md "The report") in the
// page's words: the two policies side by side (the keys the candidate changes, the totals
// of each run), the self-check, and the incidents where the policies differ, each linked
// to its recorded incident's page.
import { emptyState, h } from "./dom.js";
import { duration, timeEl } from "./format.js";
import { statusTag } from "./incidents.js";
import { section, table } from "./panels.js";

const DASH = "\u2014";
const LEVELS = ["in_process", "launcher", "exclude_node", "stop_job", "reset_gpu"];
const RUNS = [
  ["recorded", "Recorded"],
  ["current", "In force (replayed)"],
  ["candidate", "Candidate"],
];

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

function value(v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "not set");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** A signed difference, candidate - in force ("+1", "\u22121", "" when equal). */
function delta(a, b, format = String) {
  if (a === b || a === null || b === null || a === undefined || b === undefined) return "";
  const d = b - a;
  return `${d > 0 ? "+" : "\u2212"}${format(Math.abs(d))}`;
}

/** The totals of each run, one metric a row, the runs side by side. */
function totalsTable(totals) {
  const runs = RUNS.filter(([key]) => totals[key]);
  const levels = LEVELS.filter((l) => runs.some(([key]) => totals[key].actions?.[l]));
  const metrics = [
    ["incidents", "Incidents", (t) => t.incidents],
    ...levels.map((l) => [`actions.${l}`, `Actions: ${l}`, (t) => t.actions?.[l] ?? 0]),
    ["cordons", "Cordons", (t) => t.cordons],
    ["breaker_holds", "Breaker holds", (t) => t.breaker_holds],
    ["escalations", "Escalations", (t) => t.escalations],
    ["expected_recovery_s", "Expected recovery", (t) => t.expected_recovery_s, duration],
    ["recovery_unknown", "Recovery unknown (incidents)", (t) => t.recovery_unknown],
    ["goodput_lost_s", "Goodput lost (job time)", (t) => t.goodput_lost_s, duration],
    ["goodput_lost_gpu_s", "Goodput lost (GPU time)", (t) => t.goodput_lost_gpu_s, gpuTime],
  ];
  return table(
    "replay-totals",
    ["", ...runs.map(([, label]) => label), "Candidate \u2212 in force"],
    h(
      "tbody",
      {},
      metrics.map(([key, label, get, format = String]) => {
        const cur = totals.current ? get(totals.current) : null;
        const cand = totals.candidate ? get(totals.candidate) : null;
        const change = delta(cur, cand, format);
        return h(
          "tr",
          { dataset: { metric: key, differs: String(Boolean(change)) } },
          h("th", { scope: "row" }, label),
          runs.map(([run]) =>
            h("td", { class: `num run-${run}`, dataset: { run } }, format(get(totals[run]))),
          ),
          h("td", { class: "num replay-delta" }, change),
        );
      }),
    ),
    [1, 2, 3, 4],
  );
}

function gpuTime(s) {
  return s >= 3600 ? `${(s / 3600).toFixed(1)} GPU h` : `${Math.round(s)} GPU s`;
}

function changesTable(changes) {
  return table(
    "replay-changes",
    ["Policy key", "In force", "Candidate"],
    h(
      "tbody",
      {},
      changes.map((c) =>
        h(
          "tr",
          { dataset: { key: c.key } },
          h("th", { scope: "row" }, h("code", {}, c.key)),
          h("td", { class: "mono" }, value(c.current)),
          h("td", { class: "mono replay-candidate-value" }, value(c.candidate)),
        ),
      ),
    ),
  );
}

/** The measured recovery times the expectations come from, with their sample sizes. */
function recoveryModel(model) {
  const entries = Object.entries(model ?? {});
  if (!entries.length) {
    return h(
      "p",
      { class: "muted note replay-model" },
      "No incident of this period resolved with a measured recovery: expected recovery is unknown.",
    );
  }
  return h(
    "p",
    { class: "muted note replay-model" },
    "Expected recovery: the median measured here per action and launcher \u2014 ",
    entries.map(([key, m], i) => [
      i ? ", " : "",
      h("span", { dataset: { model: key } }, h("code", {}, key), ` ${duration(m.median_s)} (n=${m.n})`),
    ]),
    ". Goodput lost: the expected recovery of each incident acted on (a stop_job: the job\u2019s time to the period\u2019s end), in job and GPU time.",
  );
}

/** What one run did about an incident, in a line. */
export function did(sm) {
  if (!sm) return h("span", { class: "muted" }, "no incident");
  const parts = [
    sm.actions.length ? h("strong", {}, sm.actions.join(" \u2192 ")) : h("span", {}, "no action"),
    sm.cordons.length ? `cordons ${sm.cordons.join(", ")}` : null,
    sm.breaker_holds ? plural(sm.breaker_holds, "breaker hold") : null,
    sm.escalations ? plural(sm.escalations, "escalation") : null,
    sm.expected_recovery_s !== undefined && sm.expected_recovery_s !== null
      ? `~${duration(sm.expected_recovery_s)} expected (n=${sm.recovery_basis?.n ?? 0})`
      : null,
  ].filter(Boolean);
  const title = sm.decisions.map(([level, mode]) => `${level ?? "none"} (${mode ?? "?"})`).join(", ");
  return h(
    "span",
    { class: "replay-did", title: title ? `decisions: ${title}` : "no decision" },
    statusTag(sm.status),
    " ",
    parts.map((p, i) => [i ? " \u00b7 " : "", p]),
  );
}

function incidentCell(row) {
  return row.incident_id !== null && row.incident_id !== undefined
    ? h("a", { href: `#/incidents/${row.incident_id}` }, `#${row.incident_id}`)
    : h("span", { class: "muted", title: "the record has no such incident" }, "not recorded");
}

function incidentsTable(rows, columns) {
  return h(
    "div",
    { class: "table-scroll" },
    table(
      "replay-incidents",
      ["Incident", "Job", "Cause", "Node", "Fault", ...columns.map(([, label]) => label)],
      h(
        "tbody",
        {},
        rows.map((row) =>
          h(
            "tr",
            {
              dataset: {
                incident: String(row.incident_id ?? ""),
                differs: String(Boolean(row.differs)),
                selfCheck: String(row.self_check),
              },
            },
            h("th", { scope: "row" }, incidentCell(row)),
            h("td", {}, row.job ? h("a", { href: `#/jobs/${encodeURIComponent(row.job)}` }, row.job) : DASH),
            h("td", {}, row.cause ?? DASH),
            h("td", {}, row.node ? h("a", { href: `#/nodes/${encodeURIComponent(row.node)}` }, row.node) : DASH),
            h("td", {}, timeEl(row.fault_at)),
            columns.map(([run]) => h("td", { class: "wrap", dataset: { run } }, did(row[run]))),
          ),
        ),
      ),
    ),
  );
}

/** The report's panels. */
export function reportView(report) {
  const { totals, self_check: check } = report;
  const rows = report.incidents ?? [];
  const differing = rows.filter((r) => r.differs);
  const mismatched = rows.filter((r) => !r.self_check);
  const p = report.period ?? {};
  const changes = report.policy_changes ?? [];
  return [
    h(
      "p",
      { class: "summary replay-summary" },
      h("span", {}, "Replayed ", h("strong", {}, plural(report.evidence, "event")), ", ", plural(rows.length, "incident")),
      h("span", {}, "from ", timeEl(p.since), " to ", timeEl(p.until)),
      h("span", {}, p.job ? ["job ", h("a", { href: `#/jobs/${encodeURIComponent(p.job)}` }, p.job)] : "all jobs"),
      h("span", {}, `in ${duration(report.replay_s)}`),
    ),
    section(
      "replay-policies-heading",
      "The two policies side by side",
      h(
        "span",
        { class: "muted" },
        "in force: ",
        h("code", {}, report.policies?.current ?? DASH),
        " \u00b7 candidate: ",
        h("code", {}, report.policies?.candidate ?? DASH),
      ),
      changes.length
        ? h("div", { class: "table-scroll replay-changes-wrap" }, changesTable(changes))
        : emptyState("The candidate sets every key as the policy in force does."),
      h("div", { class: "table-scroll" }, totalsTable(totals)),
      recoveryModel(report.recovery_model),
    ),
    section(
      "replay-check-heading",
      "Self-check",
      h(
        "span",
        { class: `replay-check ${check.exact ? "replay-exact" : "replay-mismatch"}`, dataset: { exact: String(check.exact) } },
        check.exact ? "exact" : `${plural(check.mismatches, "mismatch", "mismatches")} of ${check.incidents}`,
      ),
      h(
        "p",
        { class: "muted note" },
        "The replay under the policy in force against the record: it must decide as the engine did. ",
        check.exact
          ? `It does, for every one of the ${plural(check.incidents, "incident")}.`
          : "A mismatch shows what the replay does not model (docs/replay.md): operator actions, incidents before the period, GPU samples.",
      ),
      mismatched.length
        ? incidentsTable(mismatched, [
            ["recorded", "Recorded"],
            ["current", "Replayed under the policy in force"],
          ])
        : null,
    ),
    section(
      "replay-differ-heading",
      "Incidents where they differ",
      h("span", { class: "muted replay-differ-count" }, `${differing.length} of ${rows.length}`),
      differing.length
        ? incidentsTable(differing, [
            ["current", "In force"],
            ["candidate", "Candidate"],
          ])
        : emptyState("The candidate decides every incident of the period as the policy in force does."),
    ),
  ];
}
