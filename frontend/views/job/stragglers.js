// The job page's Stragglers panel: every rank's relative and individual score, its median
// step time and whether (and since when) it is flagged; flagged ranks first, then the
// slowest.
import { emptyState, h, replace } from "../../lib/dom.js";
import { duration, timeEl } from "../../lib/format.js";
import { failure, section, table } from "../../lib/panels.js";

const MAX_ROWS = 25;

function score(v) {
  return v === null || v === undefined ? "\u2014" : Number(v).toFixed(2);
}

function rankRow(r) {
  return h(
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
  );
}

/** update(answer, flagged): GET /jobs/<job>/stragglers and its flagged ranks; fail(error). */
export function stragglersPanel() {
  const meta = h("p", { class: "muted note" });
  const root = h("div", {}, h("p", { class: "muted" }, "Loading stragglers\u2026"));
  const el = section("stragglers-heading", "Stragglers", meta, root);

  function update(answer, flagged) {
    const ranks = [...(answer.ranks ?? [])];
    replace(
      meta,
      `relative score: the fastest ranks' step time / the rank's, over windows of ${answer.window_steps ?? "?"} steps; ` +
        `flagged while it stays below ${answer.threshold ?? "?"}`,
    );
    // Flagged first, then the slowest (lowest relative score); unscored ranks last.
    const rel = (r) => r.relative_score ?? Infinity;
    ranks.sort((a, b) => Number(b.flagged) - Number(a.flagged) || rel(a) - rel(b) || a.rank - b.rank);
    const shown = ranks.slice(0, Math.max(MAX_ROWS, flagged.size));
    replace(
      root,
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
                h("tbody", {}, shown.map(rankRow)),
                [0, 2, 3, 4],
              ),
            ),
            ranks.length > shown.length ? h("p", { class: "muted note" }, `${ranks.length - shown.length} more ranks, none flagged.`) : null,
          ],
    );
  }

  return {
    el,
    update,
    fail(error) {
      replace(meta);
      replace(root, failure("stragglers", error, "Straggler detection is not available on this server yet."));
    },
  };
}
