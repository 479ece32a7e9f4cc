// What a job can carry out, from the capabilities its live ranks declared: the restart
// levels it supports and why a level is not offered.

export const LEVELS = [
  ["in_process", "in-process: the NVRx Wrapper re-enters the training function (seconds)"],
  ["launcher", "launcher: workers end, the launcher respawns them from the checkpoint"],
];

/** The levels the job can carry out ([] for none); every level on a server that does not say. */
export function restartLevels(job) {
  const levels = job?.capabilities?.levels;
  return Array.isArray(levels) ? LEVELS.filter(([level]) => levels.includes(level)) : LEVELS;
}

/** Why a level is not offered, for the dialog and the page. */
export function missingLevels(job) {
  const caps = job?.capabilities;
  if (!caps || !Array.isArray(caps.levels)) return [];
  const out = [];
  if (!caps.levels.includes("in_process")) {
    out.push("In-process is not offered: not every live rank runs under NVRx's Wrapper.");
  }
  if (!caps.levels.includes("launcher")) {
    out.push("Launcher is not offered: no launcher (torchrun, ft_launcher, Slurm) would respawn the ranks.");
  }
  return out;
}

/** Whether any rank of the job is alive. */
export const hasLive = (job) => (job.ranks ?? []).some((r) => r.alive);
