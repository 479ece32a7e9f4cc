// The job page's title (the job's label and its state) and its facts: since when and why
// it is in that state, when it ended, its size, generation (attempt, in-process
// iteration), last step and when it was seen.
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { jobEnded, jobLabel, jobState, jobStateBadge, timeEl } from "../../lib/format.js";
import { factItems } from "../../lib/panels.js";

/**
 * heading, stateSlot (for the title row) and facts (the list under it); update(job) shows
 * GET /jobs/<job>; missing() says the job has not reported; fail(error) the read failed.
 */
export function jobHeader(name) {
  const heading = h("h1", {}, name);
  const stateSlot = h("span", { class: "state-slot" });
  const facts = h("dl", { class: "facts" }, h("p", { class: "muted" }, "Loading the job\u2026"));

  function update(j) {
    const state = jobState(j);
    const label = jobLabel(j);
    replace(heading, label, label !== j.name ? h("span", { class: "muted job-id mono" }, j.name) : null);
    replace(stateSlot, jobStateBadge(j, { withEnd: false }));
    stateSlot.dataset.state = state;
    const ended = jobEnded(j);
    replace(
      facts,
      factItems([
        j.state_since ? [`${state} since`, h("span", { dataset: { field: "state-since" } }, timeEl(j.state_since))] : null,
        j.state_reason ? ["Why", h("span", { dataset: { field: "state-reason" } }, j.state_reason)] : null,
        ended ? ["Ended", h("span", { dataset: { field: "ended" } }, timeEl(j.ended_at))] : null,
        ["World size", String(j.world_size ?? "\u2014")],
        ["Attempt", h("span", { title: "launcher-level restarts so far", dataset: { field: "attempt" } }, String(j.attempt ?? 0))],
        ["Iteration", h("span", { title: "in-process restarts within this attempt", dataset: { field: "iteration" } }, String(j.iteration ?? 0))],
        ["Last step", String(j.last_step ?? "\u2014")],
        ["Last seen", timeEl(j.last_seen)],
        ["First seen", timeEl(j.first_seen)],
      ]),
    );
  }

  return {
    heading,
    stateSlot,
    facts,
    update,
    missing() {
      replace(facts, emptyState(`Job "${name}" has not reported to this server.`));
    },
    fail(error) {
      replace(facts, errorBox("Could not load the job", error));
    },
  };
}
