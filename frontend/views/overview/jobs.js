// The overview's Jobs panel: the active and recently ended jobs with their state,
// generation, last step, goodput over the last 24 h, hot spares ready and open incidents.
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { duration, fraction, jobLabel, jobState, jobStateBadge } from "../../lib/format.js";
import { section } from "../../lib/panels.js";

function jobRow(job, goodput) {
  const state = jobState(job);
  let goodputCell;
  if (goodput === undefined) goodputCell = h("span", { class: "muted" }, "\u2026");
  else if (goodput === null) goodputCell = h("span", { class: "muted", title: "no goodput route on this server" }, "n/a");
  else goodputCell = h("span", { title: `over ${duration(goodput.elapsed_s)} of job time` }, fraction(goodput.goodput));
  const label = jobLabel(job);
  return h(
    "tr",
    { dataset: { job: job.name, state, running: String(state === "running" || state === "restarting") } },
    h(
      "th",
      { scope: "row" },
      h("a", { href: `#/jobs/${encodeURIComponent(job.name)}`, title: label !== job.name ? job.name : null }, label),
    ),
    h("td", { class: "col-state" }, jobStateBadge(job, { withEnd: true })),
    h("td", { class: "num", title: `world size ${job.world_size ?? "?"}` }, `${job.attempt ?? 0} / ${job.iteration ?? 0}`),
    h("td", { class: "num" }, job.last_step ?? "\u2014"),
    h("td", { class: "num col-goodput" }, goodputCell),
    h(
      "td",
      { class: "num col-spares", dataset: { spares: String(job.spare_capacity ?? "") } },
      job.spare_capacity === undefined ? h("span", { class: "muted", title: "not reported by this server" }, "n/a") : String(job.spare_capacity),
    ),
    h(
      "td",
      { class: "num" },
      job.open_incidents
        ? h("a", { class: "bad", href: `#/incidents?job=${encodeURIComponent(job.name)}` }, String(job.open_incidents))
        : "0",
    ),
  );
}

/**
 * update({jobs, running, recent, shown, goodputs, goodputMissing}): every job the server
 * knows, the running ones, the recent ones, those shown (with goodputs: name -> answer,
 * null where there is none); fail(error): the read failed.
 */
export function jobsPanel() {
  const root = h("div", {}, h("p", { class: "muted" }, "Loading jobs\u2026"));
  const el = section("jobs-heading", "Jobs", h("a", { href: "#/jobs" }, "all jobs"), root);

  function update({ jobs, running, recent, shown, goodputs, goodputMissing }) {
    if (jobs.length === 0) {
      replace(root, emptyState("No job has reported yet."));
      return;
    }
    replace(
      root,
      running.length ? null : h("p", { class: "muted" }, recent.length ? "No job is running." : "No job is running; the most recent:"),
      h(
        "div",
        { class: "table-scroll" },
        h(
          "table",
          { class: "jobs-table compact" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              h("th", { scope: "col" }, "Job"),
              h("th", { scope: "col" }, "State"),
              h(
                "th",
                {
                  scope: "col",
                  class: "num head-wrap",
                  title:
                    "attempt: how many times the launcher restarted the job's workers; " +
                    "iteration: in-process restarts within the current attempt",
                },
                "Attempt / iteration",
              ),
              h("th", { scope: "col", class: "num" }, "Step"),
              h("th", { scope: "col", class: "num", title: "goodput over the last 24 h" }, "Goodput"),
              h(
                "th",
                { scope: "col", class: "num", title: "hot spares that could join now: launchers waiting on nodes whose agent reports and that are not cordoned" },
                "Spares",
              ),
              h("th", { scope: "col", class: "num", title: "open incidents" }, "Open"),
            ),
          ),
          h("tbody", {}, shown.map((job) => jobRow(job, goodputs.get(job.name)))),
        ),
      ),
      goodputMissing ? h("p", { class: "muted note" }, "Goodput is not available on this server yet.") : null,
      jobs.length > shown.length ? h("p", { class: "muted note" }, h("a", { href: "#/jobs" }, `${jobs.length} jobs in all`)) : null,
    );
  }

  return {
    el,
    update,
    fail(error) {
      replace(root, errorBox("Could not load jobs", error));
    },
  };
}
