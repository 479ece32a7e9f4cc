// The node page's "Ranks on this node": the ranks of recent jobs that run here, with
// their process, generation, last step, liveness and heartbeat.
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { timeEl } from "../../lib/format.js";
import { section, table } from "../../lib/panels.js";

function rankRow(r) {
  return h(
    "tr",
    { dataset: { job: r.job, rank: String(r.rank) } },
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(r.job)}` }, r.job)),
    h("td", { class: "num" }, String(r.rank)),
    h("td", { class: "num" }, String(r.local_rank ?? "\u2014")),
    h("td", { class: "num mono" }, String(r.pid ?? "\u2014")),
    h("td", { class: "num" }, String(r.attempt ?? 0)),
    h("td", { class: "num" }, String(r.iteration ?? 0)),
    h("td", { class: "num" }, r.last_step ?? "\u2014"),
    h("td", {}, r.alive ? "yes" : h("strong", { class: "bad" }, "no")),
    h("td", {}, timeEl(r.last_heartbeat)),
  );
}

/** update(hosted, searched): the ranks found ({job, ...rank}) among that many recent jobs; fail(error). */
export function ranksPanel() {
  const status = h("div", {}, h("p", { class: "muted" }, "Looking for ranks\u2026"));
  const body = h("tbody");
  const ranksTable = table(
    "ranks-table",
    ["Job", "Rank", "Local", "PID", "Attempt", "Iteration", "Last step", "Alive", "Heartbeat"],
    body,
    [1, 2, 3, 4, 5, 6],
  );
  ranksTable.hidden = true;
  const el = section("ranks-heading", "Ranks on this node", null, status, h("div", { class: "table-scroll" }, ranksTable));

  return {
    el,
    update(hosted, searched) {
      replace(body, hosted.map(rankRow));
      ranksTable.hidden = hosted.length === 0;
      replace(
        status,
        hosted.length
          ? null
          : emptyState(searched ? "No rank of a recent job runs on this node." : "No job has reported in the last hour."),
      );
    },
    fail(error) {
      replace(status, errorBox("Could not load the ranks", error));
    },
  };
}
