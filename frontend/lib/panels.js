// Small builders shared by the views: tables, fact lists, panel sections, and the honest
// states of a panel whose data comes from a route this server may not have yet.
import { isMissingRoute } from "../api.js";
import { errorBox, h } from "./dom.js";

/** A table with a header row; numeric: indexes of right-aligned columns. */
export function table(className, headers, body, numeric = []) {
  return h(
    "table",
    { class: className },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        headers.map((label, i) =>
          h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, label),
        ),
      ),
    ),
    body,
  );
}

/** <dl class="facts"> items from [label, value] pairs (null pairs are skipped). */
export function factItems(pairs) {
  return pairs
    .filter(Boolean)
    .map(([label, value]) => h("div", {}, h("dt", {}, label), h("dd", {}, value)));
}

/** What to show in place of a panel's data when its request failed. */
export function failure(what, error, missingText) {
  if (isMissingRoute(error)) {
    return h("p", { class: "empty unavailable", dataset: { unavailable: "route" } }, missingText);
  }
  return errorBox(`Could not load ${what}`, error);
}


/**
 * <section class="panel"> titled by its <h2 id=id>: head goes beside the heading in the
 * panel's head (a filter, a link), body below it.
 */
export function section(id, heading, head, ...body) {
  return h(
    "section",
    { class: "panel", "aria-labelledby": id },
    h("div", { class: "panel-head" }, h("h2", { id }, heading), head),
    body,
  );
}
