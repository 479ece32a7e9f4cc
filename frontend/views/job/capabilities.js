// The job page's "What the job can carry out" panel: in-process restarts (every live rank
// under NVRx's Wrapper or not), its launcher, and the restart levels that follow.
import { h, replace } from "../../lib/dom.js";
import { factItems } from "../../lib/panels.js";
import { hasLive, restartLevels } from "../../lib/restarts.js";

const LAUNCHER_TEXT = {
  torchrun: "torchrun",
  ft_launcher: "ft_launcher (NVRx)",
  slurm: "Slurm",
  none: "none",
};

/** What the ranks declared, alive or not (a job without live ranks: its last ranks). */
function declared(job) {
  const ranks = job.ranks ?? [];
  const flags = ranks.map((r) => r.in_process).filter((v) => v !== null && v !== undefined);
  return {
    inProcess: flags.length ? flags.every(Boolean) : null,
    launchers: [...new Set(ranks.map((r) => r.launcher).filter(Boolean))].sort(),
  };
}

function inProcessText(job) {
  const caps = job.capabilities;
  if (!caps) return h("span", { class: "muted" }, "not reported by this server");
  const live = hasLive(job);
  const value = live ? caps.in_process : declared(job).inProcess;
  const of = live ? "every live rank runs" : "its last ranks ran";
  if (value === true) return h("span", { class: "cap cap-yes" }, `yes: ${of} under NVRx's Wrapper`);
  if (value === false) {
    const who = live ? "not every live rank runs" : "not every one of its last ranks ran";
    return h("span", { class: "cap cap-no" }, `no: ${who} under NVRx's Wrapper`);
  }
  return h("span", { class: "muted" }, live ? "unknown: the ranks did not declare it (an older SDK)" : "unknown: no live rank");
}

function launcherText(job) {
  if (!job.capabilities) return h("span", { class: "muted" }, "not reported by this server");
  const launchers = hasLive(job) ? job.capabilities.launchers : declared(job).launchers;
  if (!launchers?.length) return h("span", { class: "muted" }, "unknown");
  return launchers.map((l) => LAUNCHER_TEXT[l] ?? l).join(", ");
}

function levelsText(job) {
  if (!hasLive(job) && job.capabilities) return h("span", { class: "muted" }, "none: no live rank to restart");
  const levels = restartLevels(job);
  return levels.length ? levels.map(([l]) => l.replace("_", "-")).join(", ") : "none";
}

/** The launcher's restart budget: what is left of its --max-restarts (shared by faults
 * and operator restarts), from the live ranks; at one left a launcher restart needs force. */
function budgetText(job) {
  if (!("restarts_left" in job)) return h("span", { class: "muted" }, "not reported by this server");
  const left = job.restarts_left;
  if (left === null || left === undefined) {
    return h("span", { class: "muted" }, hasLive(job) ? "unknown: no torchrun or ft_launcher budget declared (or an older SDK)" : "unknown: no live rank");
  }
  const of = `${left} of ${job.max_restarts} (--max-restarts; ${job.restart_count} used by faults and operator restarts)`;
  if (left === 0) return h("span", { class: "cap cap-no" }, `${of}: none left, the next worker failure ends the job`);
  if (left === 1) return h("span", { class: "cap cap-no" }, `${of}: the last one; a launcher restart needs force`);
  return h("span", { class: "cap cap-yes" }, of);
}

/** update(job) shows what GET /jobs/<job> says it can carry out; clear() empties it. */
export function capabilitiesPanel() {
  const list = h("dl", { class: "caps-facts", id: "capabilities" });
  const el = h(
    "section",
    { class: "panel caps-panel", "aria-labelledby": "caps-heading" },
    h("div", { class: "panel-head" }, h("h2", { id: "caps-heading" }, "What the job can carry out")),
    h("p", { class: "muted note" }, "As its live ranks declared it through the trainguard SDK; the engine and the restart control use only these levels."),
    list,
  );
  return {
    el,
    update(j) {
      replace(
        list,
        factItems([
          ["In-process restart", h("span", { dataset: { field: "in-process" } }, inProcessText(j))],
          ["Launcher", h("span", { dataset: { field: "launchers" } }, launcherText(j))],
          [
            "Launcher restarts left",
            h("span", { dataset: { field: "restarts-left", left: String(j.restarts_left ?? "") } }, budgetText(j)),
          ],
          [
            "Restart levels",
            h("span", { dataset: { field: "levels", levels: restartLevels(j).map(([l]) => l).join(",") } }, levelsText(j)),
          ],
        ]),
      );
    },
    clear() {
      replace(list);
    },
  };
}
