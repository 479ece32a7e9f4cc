// The overview's Open incidents panel: the pending incidents (awaiting an operator, or
// an exclusion held by the breaker) and the open ones, with the phase each has reached.
import { breakerHold, nodeQuestion } from "../../lib/approvals.js";
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { timeEl } from "../../lib/format.js";
import { reachedPhase } from "../../lib/incidents.js";
import { section } from "../../lib/panels.js";

function incidentItem(incident) {
  return h(
    "li",
    { class: "incident-item", dataset: { incident: String(incident.id), status: incident.status } },
    h("a", { href: `#/incidents/${incident.id}` }, `#${incident.id}`),
    " ",
    h("strong", {}, incident.level ?? "\u2014"),
    " of ",
    incident.job ? h("a", { href: `#/jobs/${encodeURIComponent(incident.job)}` }, incident.job) : "\u2014",
    " \u00b7 ",
    h("span", { class: "muted" }, `${incident.trigger ?? ""}${incident.triggered_by ? ` by ${incident.triggered_by}` : ""}`),
    " \u00b7 ",
    timeEl(incident.created_at),
    " \u00b7 ",
    incident.status === "pending"
      ? h(
          "a",
          {
            class: "phase pending",
            href: `#/incidents/${incident.id}`,
            title: breakerHold(incident) || nodeQuestion(incident) ? incident.outcome : null,
          },
          nodeQuestion(incident) ? "a question about its node" : breakerHold(incident) ? "held by the breaker" : "awaiting approval",
        )
      : h("span", { class: "phase" }, reachedPhase(incident)),
  );
}

/** update(active): the pending, then the open incidents; fail(error): the read failed. */
export function incidentsPanel() {
  const root = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
  const el = section("incidents-heading", "Open incidents", h("a", { href: "#/incidents" }, "all incidents"), root);
  return {
    el,
    update(active) {
      replace(
        root,
        active.length ? h("ul", { class: "incident-list" }, active.map(incidentItem)) : emptyState("No open incidents."),
      );
    },
    fail(error) {
      replace(root, errorBox("Could not load incidents", error));
    },
  };
}
