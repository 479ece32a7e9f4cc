// Approve or reject a pending incident: a dry-run recommendation, or an automatic node
// exclusion the breaker held (its cap of automatic cordons was reached). A confirmation
// dialog with a reason, then POST /incidents/<id>/approve|reject (operator; audited).
import { apiPost, canOperate, isMissingRoute } from "../api.js";
import { confirmDialog } from "../components/confirm-dialog.js";
import { h } from "./dom.js";

/** The decision that holds a pending incident when the breaker held it, else null. */
export function breakerHold(incident) {
  if (incident?.status !== "pending") return null;
  const last = (incident.decisions ?? []).at(-1);
  return last?.mode === "breaker" ? last : null;
}

/** The decision that holds a pending incident because its restart would use the
 * launcher's last restart (--max-restarts), else null. */
export function budgetHold(incident) {
  if (incident?.status !== "pending") return null;
  const last = (incident.decisions ?? []).at(-1);
  return last?.mode === "budget" ? last : null;
}

/** The decision of a held exclusion whose job ended: a question about the node only
 * (approving it cordons the node, nothing is restarted), else null. */
export function nodeQuestion(incident) {
  if (incident?.status !== "pending") return null;
  const last = (incident.decisions ?? []).at(-1);
  return last?.mode === "node_only" ? last : null;
}

/** Why a pending incident waits, in words: the breaker's or the budget's outcome, or the
 * dry-run mode. */
export function pendingWhy(incident) {
  if (nodeQuestion(incident)) {
    return incident.outcome || `its job ended: approving cordons ${nodeQuestion(incident).node ?? "the node"} only`;
  }
  const held = breakerHold(incident);
  if (held) {
    return incident.outcome || `the breaker held the exclusion of ${held.node ?? "its node"}`;
  }
  if (budgetHold(incident)) {
    return incident.outcome || "the restart would use the launcher's last restart (--max-restarts)";
  }
  return "dry-run mode: the engine only recommends";
}

export function decide(incident, verdict, signal) {
  const approve = verdict === "approve";
  const question = nodeQuestion(incident);
  const held = breakerHold(incident) ?? question;
  const node = held?.node ?? incident.node;
  return confirmDialog({
    title: `${approve ? "Approve" : "Reject"} the ${held ? "held exclusion" : "recommendation"} of incident #${incident.id}?`,
    text: approve
      ? question
        ? `The engine will cordon ${node ?? "the node"}. Job ${incident.job} has ended: nothing is restarted.`
        : held
        ? `The engine will cordon ${node ?? "the node"} and restart job ${incident.job} without it, past the breaker's cap.`
        : budgetHold(incident)
          ? `The engine will carry out "${incident.level}" on job ${incident.job}, using the launcher's last restart: after it, the next worker failure ends the job.`
          : `The engine will carry out "${incident.level}" on job ${incident.job}.`
      : held
        ? `${node ?? "The node"} is not cordoned; the incident is closed as rejected.`
        : "Nothing is done; the incident is closed as rejected.",
    confirmLabel: approve ? "Approve" : "Reject",
    danger: approve,
    fields: [{ name: "reason", label: "Reason (audited)", required: true }],
    signal,
    action: async ({ reason }) => {
      try {
        return await apiPost(`incidents/${incident.id}/${verdict}`, { reason }, { signal });
      } catch (error) {
        if (isMissingRoute(error)) {
          throw new Error("approvals are not available on this server yet");
        }
        throw error;
      }
    },
  });
}

/**
 * Approve / Reject buttons for a pending incident; onDone() after either succeeded. None
 * for a viewer's token.
 */
export function decisionButtons(incident, signal, onDone) {
  if (!canOperate()) return null;
  const make = (verdict, label, cls) =>
    h(
      "button",
      {
        type: "button",
        class: `btn ${cls}`,
        dataset: { verdict, incident: String(incident.id) },
        onclick: async (event) => {
          const button = event.currentTarget;
          const result = await decide(incident, verdict, signal);
          if (result) onDone?.(result);
          else button.focus();
        },
      },
      label,
    );
  return h(
    "span",
    { class: "decision-buttons" },
    make("approve", "Approve\u2026", "btn-primary"),
    make("reject", "Reject\u2026", ""),
  );
}
