// The job page's restart control (operator): a confirmation with a level the job supports
// and a reason; a 202 leads to the new incident, a 409 is shown in the dialog with the
// server's reason. The control says why it is not offered rather than failing on a click.
import { apiPost } from "../../api.js";
import { confirmDialog } from "../../components/confirm-dialog.js";
import { h } from "../../lib/dom.js";
import { jobEnded, jobLabel, jobState } from "../../lib/format.js";
import { hasLive, missingLevels, restartLevels } from "../../lib/restarts.js";

/**
 * button and note (for the title row); update(job) offers the restart or says why not;
 * disable() for a job that has not reported. current() is the job last shown; reload()
 * re-reads it (what it can carry out now) and shows it.
 */
export function restartControl({ name, signal, current, reload }) {
  const enc = encodeURIComponent(name);
  const button = h("button", { type: "button", class: "btn btn-danger", id: "restart-job", "aria-describedby": "restart-note" }, "Restart\u2026");
  const note = h("span", { class: "muted restart-note", id: "restart-note" });

  function update(j) {
    const state = jobState(j);
    let why = "";
    if (jobEnded(j) && !hasLive(j)) why = `The job has ${state}: there is nothing to restart.`;
    else if (!restartLevels(j).length) why = "No restart level: the ranks run under no launcher and not under NVRx's Wrapper.";
    button.disabled = Boolean(why);
    note.textContent = why;
  }

  button.addEventListener("click", async () => {
    // What the job can carry out now (its ranks may have changed since the last read).
    await reload();
    if (signal.aborted || button.disabled) return;
    const job = current();
    const levels = restartLevels(job);
    const result = await confirmDialog({
      title: `Restart ${jobLabel(job) || name}?`,
      text: "Every live rank of the job is restarted at the chosen level. The action is audited with your reason.",
      confirmLabel: "Restart",
      danger: true,
      fields: [
        {
          name: "level",
          label: "Level",
          kind: "select",
          options: levels,
          value: levels[0][0],
          help: missingLevels(job).join(" ") || null,
        },
        { name: "reason", label: "Reason", required: true, placeholder: "why, for the audit log" },
        {
          // Offered only when the server refuses a launcher restart that would use the
          // launcher's last one (409, code restart_budget): the operator may force it.
          name: "force",
          // (no help line: the server's refusal above it says what the budget is)
          label: "Use the launcher's last restart anyway (force)",
          kind: "checkbox",
          hidden: true,
        },
      ],
      signal,
      action: ({ level, reason, force }) =>
        apiPost(`jobs/${enc}/restarts`, force ? { level, reason, force: true } : { level, reason }, { signal }),
      // A 409: the job cannot carry it out (any more); the page shows what it can now.
      // The launcher's budget: the dialog offers the force.
      onRefused: (error, dialog) => {
        if (error.status !== 409) return;
        if (error.code === "restart_budget") dialog.reveal("force");
        reload();
      },
    });
    if (result?.incident_id !== undefined) {
      location.hash = `#/incidents/${result.incident_id}`;
    } else {
      button.focus();
    }
  });

  return {
    button,
    note,
    update,
    disable() {
      button.disabled = true;
    },
  };
}
