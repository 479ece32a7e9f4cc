// A node's cordon in words: who or what took it out of new work, why, on which evidence,
// since when, and whether it is flagged for repair. Shared by the node grid's tooltips,
// the overview's node table and the node page (GET /nodes: `cordon`, `cordons_recent`,
// `repair`; GET /nodes/<name>/cordons: the history, same shape as `cordon`).
import { h } from "./dom.js";
import { localTime, timeEl } from "./format.js";

export const ENGINE_ACTOR = "engine";

/** "trainguard" for the decision engine's cordons, else the operator's name. */
export function actorText(by) {
  if (!by) return "unknown";
  return by === ENGINE_ACTOR ? "trainguard" : by;
}

/** One line for tooltips and the grid's readout: "cordoned by trainguard since 14:03 · incident #12 · ...". */
export function cordonText(node) {
  const c = node?.cordon;
  if (!node?.cordoned && !c) return "";
  const parts = [c ? `cordoned by ${actorText(c.by)} since ${localTime(c.at)}` : "cordoned"];
  if (c?.incident_id !== null && c?.incident_id !== undefined) parts.push(`incident #${c.incident_id}`);
  if (c?.reason) parts.push(c.reason);
  if (c?.evidence) parts.push(`evidence: ${c.evidence}`);
  if (node.repair) parts.push(`flagged for repair (${node.cordons_recent} cordons in 7 days)`);
  return parts.join(" \u00b7 ");
}

/** "flagged for repair" ({short: true}: "repair", for tables). */
export function repairBadge(node, { short = false } = {}) {
  return h(
    "span",
    {
      class: "badge badge-repair",
      title: `flagged for repair: cordoned ${node.cordons_recent ?? "several"} times within the repair window; only an operator readmits it`,
    },
    short ? "repair" : "flagged for repair",
  );
}

export function incidentLink(id) {
  if (id === null || id === undefined) return null;
  return h("a", { href: `#/incidents/${id}`, class: "cordon-incident" }, `incident #${id}`);
}

/** The overview table's cell: who, since when, the incident link; the reason on hover. */
export function cordonCell(node) {
  const c = node?.cordon;
  if (!c) return node?.cordoned ? h("span", { class: "muted" }, "cordoned") : null;
  return h(
    "span",
    { class: "cordon-brief", title: [c.reason, c.evidence && `evidence: ${c.evidence}`].filter(Boolean).join("\n") },
    `by ${actorText(c.by)} `,
    timeEl(c.at),
    c.incident_id !== null && c.incident_id !== undefined ? [" \u00b7 ", incidentLink(c.incident_id)] : null,
    node.repair ? [" ", repairBadge(node, { short: true })] : null,
  );
}
