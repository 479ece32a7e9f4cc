// Jobs (#/jobs): every job the server knows, most recently active first, with its state
// (and when it ended), generation, last step, goodput over the last 24 h, stragglers and
// open incidents.
// Loaded from GET /jobs (+ /goodput and /stragglers of the jobs shown) and re-read every
// 10 s on the live stream's `nodes` tick.
import { apiGet, isMissingRoute } from "../api.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { fraction, jobEnded, jobLabel, jobState, jobStateBadge, timeEl } from "../lib/format.js";
import { table } from "../lib/panels.js";

export const title = "Jobs";

const EVERY_S = 10;
const MAX_DETAILED = 50; // jobs whose goodput and stragglers are read

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "incidents"]);
  const body = h("div", {}, h("p", { class: "muted" }, "Loading jobs\u2026"));
  const note = h("div");
  replace(
    root,
    h("h1", {}, "Jobs"),
    h("section", { class: "panel", "aria-label": "jobs" }, body, note),
  );

  let readAt = 0;
  const missing = { goodput: false, stragglers: false };

  async function optional(kind, path, params) {
    if (missing[kind]) return null;
    try {
      return await apiGet(path, params, { signal: ctx.signal });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      if (isMissingRoute(error)) missing[kind] = true;
      return null;
    }
  }

  async function load() {
    readAt = Date.now() / 1000;
    try {
      const jobs = await apiGet("jobs", {}, { signal: ctx.signal });
      if (!jobs.length) {
        replace(body, emptyState("No job has reported yet."), h("p", { class: "muted" }, "Jobs appear when their ranks report steps through the trainguard SDK."));
        return;
      }
      const detailed = jobs.slice(0, MAX_DETAILED);
      const extra = await Promise.all(
        detailed.map(async (job) => {
          const enc = encodeURIComponent(job.name);
          const [goodput, stragglers] = await Promise.all([
            optional("goodput", `jobs/${enc}/goodput`, { window: "24h" }),
            // An ended job has no stragglers to flag.
            jobEnded(job) ? null : optional("stragglers", `jobs/${enc}/stragglers`, {}),
          ]);
          return { goodput, stragglers };
        }),
      );
      replace(
        body,
        h(
          "div",
          { class: "table-scroll" },
          table(
            "jobs-table",
            ["Job", "State", "Ranks", "Attempt", "Iteration", "Last step", "Goodput 24h", "Stragglers", "Open incidents", "Last seen"],
            h(
              "tbody",
              {},
              jobs.map((job, i) => {
                const state = jobState(job);
                const { goodput, stragglers } = extra[i] ?? {};
                const nFlagged = stragglers ? (stragglers.ranks ?? []).filter((r) => r.flagged).length : null;
                const label = jobLabel(job);
                return h(
                  "tr",
                  { dataset: { job: job.name, state, running: String(state === "running" || state === "restarting") } },
                  h(
                    "th",
                    { scope: "row" },
                    h("a", { href: `#/jobs/${encodeURIComponent(job.name)}` }, label),
                    label !== job.name ? h("span", { class: "muted job-id mono" }, job.name) : null,
                  ),
                  h("td", { class: "col-state" }, jobStateBadge(job, { withEnd: true })),
                  h("td", { class: "num" }, String(job.world_size ?? "\u2014")),
                  h("td", { class: "num" }, String(job.attempt ?? 0)),
                  h("td", { class: "num" }, String(job.iteration ?? 0)),
                  h("td", { class: "num" }, job.last_step ?? "\u2014"),
                  h("td", { class: "num col-goodput" }, goodput ? fraction(goodput.goodput) : h("span", { class: "muted" }, "n/a")),
                  h(
                    "td",
                    { class: "num" },
                    nFlagged === null
                      ? h("span", { class: "muted" }, jobEnded(job) ? "\u2014" : "n/a")
                      : nFlagged ? h("span", { class: "status status-straggler" }, String(nFlagged)) : "0",
                  ),
                  h(
                    "td",
                    { class: "num" },
                    job.open_incidents
                      ? h("a", { class: "bad", href: `#/incidents?job=${encodeURIComponent(job.name)}` }, String(job.open_incidents))
                      : "0",
                  ),
                  h("td", {}, timeEl(job.last_seen)),
                );
              }),
            ),
            [2, 3, 4, 5, 6, 7, 8],
          ),
        ),
      );
      replace(
        note,
        missing.goodput ? h("p", { class: "muted note" }, "Goodput is not available on this server yet.") : null,
        missing.stragglers ? h("p", { class: "muted note" }, "Straggler detection is not available on this server yet.") : null,
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(body, errorBox("Could not load jobs", error));
    }
  }

  load();
  const offNodes = ctx.stream.on("nodes", () => {
    if (Date.now() / 1000 - readAt >= EVERY_S) load();
  });
  const offIncident = ctx.stream.on("incident", () => load());
  return () => {
    offNodes();
    offIncident();
  };
}
