// Formatting shared by the views: times (local on screen, UTC on hover), readings and
// the small badges for health and simulated sources.
import { h } from "./dom.js";

const pad = (n, width = 2) => String(n).padStart(width, "0");

function sameLocalDay(a, b) {
  return (
    a.getFullYear() === b.getFullYear() &&
    a.getMonth() === b.getMonth() &&
    a.getDate() === b.getDate()
  );
}

/** Local wall time: "14:03:07" today, "2026-11-28 14:03:07" on another day. */
export function localTime(ts) {
  const d = new Date(ts * 1000);
  const clock = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (sameLocalDay(d, new Date())) return clock;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock}`;
}

/** "2026-11-29 13:03:07.250 UTC" */
export function utcTime(ts) {
  return new Date(ts * 1000).toISOString().replace("T", " ").replace("Z", " UTC");
}

/** <time> in local time with the UTC instant in its title; "never" for a missing time. */
export function timeEl(ts, { className = "" } = {}) {
  if (ts === null || ts === undefined) return h("span", { class: "muted" }, "never");
  return h(
    "time",
    {
      class: className || null,
      datetime: new Date(ts * 1000).toISOString(),
      title: utcTime(ts),
      dataset: { ts: String(ts) },
    },
    localTime(ts),
  );
}

const DASH = "\u2014";

export function pct(value, digits = 0) {
  return value === null || value === undefined ? DASH : `${Number(value).toFixed(digits)} %`;
}

export function celsius(value) {
  return value === null || value === undefined ? DASH : `${Math.round(value)} \u00b0C`;
}

export function mib(used, total) {
  if (used === null || used === undefined) return total ? `${DASH} / ${gib(total)}` : DASH;
  return total ? `${gib(used)} / ${gib(total)}` : gib(used);
}

function gib(valueMib) {
  return `${(valueMib / 1024).toFixed(1)} GiB`;
}

export function watts(value) {
  return value === null || value === undefined ? DASH : `${Math.round(value)} W`;
}

/**
 * A duration for people: "420 \u00b5s", "4.27 ms", "42.7 ms", "850 ms", "4.2 s", "3 min 05 s",
 * "2 h 10 min". Three significant digits below a second, so a sub-millisecond step never
 * reads "0 ms".
 */
export function duration(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return DASH;
  const v = Math.max(0, value);
  if (v === 0) return "0 s";
  // Thresholds on the rounded value: 0.9996 ms reads "1.00 ms", not "1000 \u00b5s".
  const us = v * 1e6;
  const ms = v * 1e3;
  if (us < 0.5) return "<1 \u00b5s";
  if (us < 999.5) return `${Math.round(us)} \u00b5s`;
  if (ms < 9.995) return `${ms.toFixed(2)} ms`;
  if (ms < 99.95) return `${ms.toFixed(1)} ms`;
  if (ms < 999.5) return `${Math.round(ms)} ms`;
  if (v < 60) return `${v.toFixed(v < 10 ? 2 : 1)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${pad(Math.floor(v % 60))} s`;
  if (v < 86400) return `${Math.floor(v / 3600)} h ${pad(Math.floor((v % 3600) / 60))} min`;
  return `${Math.floor(v / 86400)} d ${Math.floor((v % 86400) / 3600)} h`;
}

/** A 0..1 fraction as a percentage: "97.3 %". */
export function fraction(value, digits = 1) {
  return value === null || value === undefined ? DASH : `${(value * 100).toFixed(digits)} %`;
}

export function seconds(value) {
  if (value === null || value === undefined) return DASH;
  const v = Math.abs(value) < 0.005 ? 0 : Number(value); // no "-0.00 s"
  return `${v.toFixed(2)} s`;
}

// Worst first: the overview lists problems at the top.
// "straggler" is not a node status of the API: the dashboard derives it from the
// stragglers of running jobs (a healthy node hosting a flagged rank).
export const STATUS_ORDER = ["down", "agent_down", "degraded", "straggler", "cordoned", "healthy"];

const STATUS_HINT = {
  healthy: "reporting, no open faults",
  degraded: "reporting, with a fault or a warning on the node (late batches, a recent XID, a lost GPU)",
  straggler: "reporting, but a rank on it is flagged as a straggler",
  down: "the agent stopped reporting",
  agent_down: "the agent said it was going away (an upgrade, a stop); its node and ranks are not judged by its silence",
  cordoned: "taken out of scheduling (no new work) by an operator or by trainguard",
};

/** Health as colour and text (never colour alone). */
export function statusBadge(status) {
  const known = STATUS_ORDER.includes(status) ? status : "unknown";
  return h(
    "span",
    { class: `status status-${known}`, title: STATUS_HINT[known] ?? "unknown status" },
    h("span", { class: "dot", "aria-hidden": "true" }),
    status ?? "unknown",
  );
}

// Job states (DESIGN.md, glossary): each with its own colour and a word, never colour alone.
export const JOB_STATES = ["running", "restarting", "waiting", "finished", "failed", "stopped"];
// A stopped job (automatic restarts given up) may train on: it ends finished or failed.
export const JOB_ENDED = ["finished", "failed"];

const JOB_STATE_HINT = {
  running: "training: its ranks are reporting",
  restarting: "a restart of the job is under way",
  waiting: "no schedulable node is left for the job",
  finished: "every rank exited 0 at the end",
  failed: "its ranks are gone and the launcher gave up",
  stopped: "trainguard gave up restarting it (stop_job): an operator must act; it may still be training",
  idle: "no state from this server; the job has not reported for a while",
  unknown: "unknown state",
};

const RUNNING_WITHIN_S = 60; // a server without job states: reported within this window
const SILENT_AFTER_S = 120; // an active job that has not reported for this long says so

/** The job's state, or (a server without states) "running" / "idle" from when it last reported. */
export function jobState(job, now = Date.now() / 1000) {
  if (job?.state) return job.state;
  return now - (job?.last_seen ?? 0) <= RUNNING_WITHIN_S ? "running" : "idle";
}

export function jobEnded(job) {
  return JOB_ENDED.includes(jobState(job));
}

/** Seconds since an active (not ended) job last reported, when that is suspiciously long; else null. */
export function jobSilentFor(job, now = Date.now() / 1000) {
  if (!job?.last_seen || jobEnded(job) || jobState(job, now) === "idle") return null;
  const age = now - job.last_seen;
  return age > SILENT_AFTER_S ? age : null;
}

/** The job's readable name (the server's display_name, else its name). */
export function jobLabel(job) {
  return job?.display_name || job?.name || "";
}

/**
 * The state as a badge: a distinct style per state, the reason and since when on hover;
 * ended jobs say when they ended ({withEnd: true} adds it as text beside the badge).
 */
export function jobStateBadge(job, { withEnd = false } = {}) {
  const state = jobState(job);
  const known = JOB_STATES.includes(state) || state === "idle" ? state : "unknown";
  const hint = [job?.state_reason || JOB_STATE_HINT[known]];
  if (job?.state_since) hint.push(`since ${utcTime(job.state_since)}`);
  if (job?.ended_at) hint.push(`ended ${utcTime(job.ended_at)}`);
  const badge = h(
    "span",
    { class: `job-state job-state-${known}`, title: hint.join("; "), dataset: { state } },
    state,
  );
  const silent = jobSilentFor(job);
  const ended = withEnd && JOB_ENDED.includes(state) && job?.ended_at;
  if (!silent && !ended) return badge;
  return h(
    "span",
    { class: "job-state-wrap" },
    badge,
    " ",
    ended ? h("span", { class: "muted job-ended" }, "ended ", timeEl(job.ended_at)) : null,
    silent
      ? h("span", { class: "job-silent", title: "its ranks have not reported since; the state is the last one known" }, `no report for ${duration(silent)}`)
      : null,
  );
}

export function simulatedBadge() {
  return h(
    "span",
    {
      class: "badge badge-simulated",
      title: "readings come from the simulated collector, not from real hardware",
    },
    "simulated",
  );
}

/**
 * A sample with every reading missing: the GPU fell off the bus (XID 79) or NVML lost it;
 * NVML answers nothing for such a device, and the agent still sends the empty sample.
 */
export function gpuLost(sample) {
  if (!sample) return false;
  return Object.entries(sample).every(
    ([key, value]) => key === "uuid" || key === "ts" || value === null || value === undefined,
  );
}

const LOST_HINT =
  "every reading of the latest sample is missing: the GPU fell off the bus (XID 79) or the driver lost it";

/** "lost" as a word in red, never colour alone. */
export function lostBadge(hint = LOST_HINT) {
  return h("span", { class: "badge badge-lost", title: hint }, "lost");
}

/** "GPU-3b1c5e2a…9f0a21": long UUIDs shortened for tables; the full one goes in a title. */
export function shortUuid(uuid) {
  if (!uuid || uuid.length <= 24) return uuid ?? "";
  return `${uuid.slice(0, 12)}\u2026${uuid.slice(-6)}`;
}
