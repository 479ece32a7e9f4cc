// What an incident's fields say, in the words and tags every view uses: the phase it has
// reached, its status tag, and whether it recovered without a command of trainguard's.
import { h } from "./dom.js";

const PHASES = [
  ["resumed_at", "resumed"],
  ["restarted_at", "restarted"],
  ["torn_down_at", "torn down"],
  ["delivered_at", "delivered"],
  ["decided_at", "decided"],
  ["detected_at", "detected"],
  ["fault_at", "fault"],
];

/** The furthest phase an incident has reached. */
export function reachedPhase(incident) {
  const t = incident.timeline ?? {};
  return PHASES.find(([field]) => t[field] !== null && t[field] !== undefined)?.[1] ?? "\u2014";
}

export function statusTag(status) {
  return h("span", { class: `incident-status incident-${status}` }, status);
}

/** An incident that ended without a command of trainguard's (NVRx or the launcher recovered it). */
export function recoveredByItself(incident) {
  return typeof incident?.outcome === "string" && incident.outcome.startsWith("recovered by itself");
}
