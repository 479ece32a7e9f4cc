// The job page's Ranks panel: every rank with its node, process, generation, last step,
// liveness and heartbeat (the dead ones first), and what it runs under when the ranks
// differ.
import { emptyState, h, replace } from "../../lib/dom.js";
import { timeEl } from "../../lib/format.js";
import { section, table } from "../../lib/panels.js";

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

/** update(ranks): the ranks of GET /jobs/<job>. */
export function ranksPanel() {
  const root = h("div", {}, h("p", { class: "muted" }, "Loading ranks\u2026"));
  const el = section("ranks-heading", "Ranks", null, root);

  function update(ranks) {
    if (!ranks.length) {
      replace(root, emptyState("No rank has reported."));
      return;
    }
    const ordered = [...ranks].sort((a, b) => Number(a.alive) - Number(b.alive) || a.rank - b.rank);
    // What each rank runs under, only when they differ (else the capabilities say it):
    // then it names the ranks that keep the job from in-process restarts.
    const mixed = new Set(ranks.map((r) => `${r.in_process}|${r.launcher}`)).size > 1;
    root.dataset.mixed = String(mixed);
    replace(
      root,
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

  return { el, update };
}
