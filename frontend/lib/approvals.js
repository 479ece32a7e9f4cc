// Approve or reject a pending (dry-run) recommendation: a confirmation dialog with a
// reason, then POST /incidents/<id>/approve|reject (operator; audited).
import { apiPost, isMissingRoute } from "../api.js";
import { confirmDialog } from "../components/confirm-dialog.js";
import { h } from "./dom.js";

export function decide(incident, verdict, signal) {
  const approve = verdict === "approve";
  return confirmDialog({
    title: `${approve ? "Approve" : "Reject"} the recommendation of incident #${incident.id}?`,
    text: approve
      ? `The engine will carry out "${incident.level}" on job ${incident.job}.`
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

/** Approve / Reject buttons for a pending incident; onDone() after either succeeded. */
export function decisionButtons(incident, signal, onDone) {
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
