// The job page's Incidents panel: the job's latest incidents with their level, status,
// the phase each has reached and its recovery time.
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { duration, timeEl } from "../../lib/format.js";
import { reachedPhase } from "../../lib/incidents.js";
import { section } from "../../lib/panels.js";

function incidentItem(i) {
  return h(
    "li",
    { class: "incident-item", dataset: { incident: String(i.id), status: i.status } },
    h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`),
    ` ${i.level} \u00b7 ${i.status} \u00b7 `,
    h("span", { class: "phase" }, reachedPhase(i)),
    " \u00b7 ",
    timeEl(i.created_at),
    i.recovery_s !== null && i.recovery_s !== undefined ? ` \u00b7 recovered in ${duration(i.recovery_s)}` : null,
  );
}

/** update(list): GET /incidents?job=<job>; fail(error). */
export function incidentsPanel(name) {
  const root = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
  const all = h("a", { href: `#/incidents?job=${encodeURIComponent(name)}` }, "all of this job's");
  const el = section("job-incidents-heading", "Incidents", all, root);
  return {
    el,
    update(list) {
      replace(
        root,
        list.length ? h("ul", { class: "incident-list" }, list.map(incidentItem)) : emptyState("No incidents for this job."),
      );
    },
    fail(error) {
      replace(root, errorBox("Could not load incidents", error));
    },
  };
}
