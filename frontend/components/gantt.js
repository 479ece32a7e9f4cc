// An incident's recovery as a Gantt chart: one bar of phases (fault -> detected ->
// decided -> delivered -> torn down -> restarted -> resumed) on a shared time axis, one
// row per node below it from that node's command acks, and a table of every milestone with
// its time (local, UTC on hover) and the duration of the phase it ends. A phase still
// running on an open incident is drawn up to now, hatched. Plain DOM: a handful of bars.
import { h, replace } from "../lib/dom.js";
import { duration, timeEl } from "../lib/format.js";

export const MILESTONES = [
  ["fault_at", "fault"],
  ["detected_at", "detected"],
  ["decided_at", "decided"],
  ["delivered_at", "delivered"],
  ["torn_down_at", "torn down"],
  ["restarted_at", "restarted"],
  ["resumed_at", "resumed"],
];

// The phase that ends at each milestone (after the first).
const PHASE = {
  detected_at: ["detection", "#f59e0b"],
  decided_at: ["decision", "#8b5cf6"],
  delivered_at: ["delivery", "#3b82f6"],
  torn_down_at: ["teardown", "#ef4444"],
  restarted_at: ["restart", "#f97316"],
  resumed_at: ["resume", "#16a34a"],
};

const NODE_PHASES = [
  ["delivered", "delivered_at"],
  ["torn_down", "torn_down_at"],
  ["restarted", "restarted_at"],
  ["resumed", "resumed_at"],
];

/** [{field, label, ts}] of the incident's timeline, in phase order. */
function milestones(timeline) {
  return MILESTONES.map(([field, label]) => ({ field, label, ts: timeline?.[field] ?? null }));
}

/** Bars of one row: consecutive known milestones; an open tail runs to `now`. */
function segments(points, open, now) {
  const known = points.filter((p) => p.ts !== null);
  const out = [];
  for (let i = 1; i < known.length; i++) {
    const [name, colour] = PHASE[known[i].field];
    out.push({ from: known[i - 1].ts, to: known[i].ts, name, colour, field: known[i].field });
  }
  const last = known.at(-1);
  const nextField = points[points.findIndex((p) => p === last) + 1]?.field;
  if (open && last && nextField && now > last.ts) {
    const [name, colour] = PHASE[nextField];
    out.push({ from: last.ts, to: now, name: `${name} (waiting)`, colour, field: nextField, running: true });
  }
  return out;
}

function niceStep(span) {
  const raw = span / 6;
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? mag * 10;
}

/** Render the chart of `incident` (GET /incidents/<id>) into root. */
export function renderGantt(root, incident, now = Date.now() / 1000) {
  const open = incident.status === "open";
  const points = milestones(incident.timeline);
  const rows = [{ label: "incident", segments: segments(points, open, now), points }];
  for (const cmd of incident.commands ?? []) {
    const acks = Object.fromEntries((cmd.acks ?? []).map((a) => [a.phase, a.ts]));
    const nodePoints = [
      { field: "decided_at", label: "issued", ts: cmd.issued_at ?? null },
      ...NODE_PHASES.map(([phase, field]) => ({ field, label: phase.replace("_", " "), ts: acks[phase] ?? null })),
    ];
    const failed = (cmd.acks ?? []).find((a) => a.phase === "failed");
    rows.push({ label: cmd.node, segments: segments(nodePoints, open && !failed, now), points: nodePoints, failed });
  }
  // The axis covers the milestones reached; a phase still waiting runs past it by at most
  // a third of that (marked with an arrow), so a long wait does not squash the rest.
  const reached = rows.flatMap((r) => r.points.filter((p) => p.ts !== null).map((p) => p.ts));
  if (!reached.length) {
    replace(root, h("p", { class: "empty" }, "No timeline yet."));
    return;
  }
  const t0 = Math.min(...reached);
  const tReached = Math.max(...reached);
  const waiting = rows.some((r) => r.segments.some((s) => s.running));
  const headroom = waiting ? Math.max((tReached - t0) / 3, 1) : 0;
  const t1 = Math.max(tReached + headroom, t0 + 0.001);
  for (const row of rows) {
    for (const s of row.segments) {
      if (s.running && s.to > t1) {
        s.shownTo = t1;
        s.clipped = true;
      }
    }
  }
  const span = t1 - t0;
  const x = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;

  const step = niceStep(span);
  const ticks = [];
  for (let t = 0; t <= span + 1e-9; t += step) ticks.push(t);

  const chart = h(
    "div",
    { class: "gantt", role: "img", "aria-label": "recovery timeline; the table below lists every phase" },
    rows.map((row) =>
      h(
        "div",
        { class: "gantt-row", dataset: { row: row.label } },
        h("div", { class: "gantt-label", title: row.label }, row.label, row.failed ? h("span", { class: "bad" }, " failed") : null),
        h(
          "div",
          { class: "gantt-track" },
          row.segments.map((s) =>
            h(
              "div",
              {
                class: `gantt-bar${s.running ? " running" : ""}${s.clipped ? " clipped" : ""}`,
                dataset: { phase: s.field },
                style: `left:${x(s.from)};width:max(3px, calc(${x(s.shownTo ?? s.to)} - ${x(s.from)}));--bar:${s.colour}`,
                title: `${s.name}: ${duration(s.to - s.from)}`,
              },
              h("span", { class: "gantt-bar-label" }, `${s.name} ${duration(s.to - s.from)}`),
            ),
          ),
          row.points
            .filter((p) => p.ts !== null)
            .map((p) => h("span", { class: "gantt-mark", style: `left:${x(p.ts)}`, title: `${p.label} at +${duration(p.ts - t0)}` })),
        ),
      ),
    ),
    h(
      "div",
      { class: "gantt-row gantt-axis" },
      h("div", { class: "gantt-label" }),
      h(
        "div",
        { class: "gantt-track" },
        ticks.map((t) => h("span", { class: "gantt-tick", style: `left:${x(t0 + t)}` }, `+${duration(t)}`)),
      ),
    ),
  );

  // The milestones as a table: time, and how long the phase ending there took.
  let prev = null;
  const table = h(
    "table",
    { class: "timeline-table" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", { scope: "col" }, "Milestone"),
        h("th", { scope: "col" }, "Time"),
        h("th", { scope: "col" }, "Phase"),
        h("th", { scope: "col", class: "num" }, "Duration"),
        h("th", { scope: "col", class: "num" }, "Since fault"),
      ),
    ),
    h(
      "tbody",
      {},
      points.map((p) => {
        const [phase, colour] = PHASE[p.field] ?? ["", null];
        const took = p.ts !== null && prev !== null ? p.ts - prev : null;
        if (p.ts !== null) prev = p.ts;
        const fault = incident.timeline?.fault_at ?? null;
        return h(
          "tr",
          { dataset: { milestone: p.field, reached: String(p.ts !== null) } },
          h("th", { scope: "row" }, p.label),
          h("td", {}, p.ts === null ? h("span", { class: "muted" }, open ? "not yet" : "\u2014") : timeEl(p.ts)),
          h("td", {}, colour ? h("span", { class: "legend-swatch", style: `background:${colour}` }) : null, phase),
          h("td", { class: "num" }, took === null ? "\u2014" : duration(took)),
          h("td", { class: "num" }, p.ts !== null && fault !== null ? duration(p.ts - fault) : "\u2014"),
        );
      }),
    ),
  );
  replace(root, chart, h("div", { class: "table-scroll" }, table));
  root.dataset.reached = String(points.filter((p) => p.ts !== null).length);
}
