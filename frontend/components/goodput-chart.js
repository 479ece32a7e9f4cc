// Goodput over time as stacked bars (uPlot bars): each bar is one interval of the job's
// time split into productive steps and the badput buckets, as shares of the interval.
// uPlot has no stacking of its own: each series holds the running sum from the bottom
// and the series are drawn from the top of the stack down, so each bar covers the part
// below it (as in uPlot's demos/stack.js); the legend shows each bucket's own share.
import uPlot from "../vendor/uPlot-1.6.32.esm.js";
import { h } from "../lib/dom.js";
import { localTime } from "../lib/format.js";
import { TIME_INCRS, tickLabel } from "./gpu-chart.js";

// Bottom of the stack first.
export const GOODPUT_PARTS = [
  ["productive", "Productive", "#16a34a"],
  ["initialization", "Initialization", "#94a3b8"],
  ["checkpoint_save", "Checkpoint save", "#6366f1"],
  ["checkpoint_restore", "Checkpoint restore", "#a855f7"],
  ["recovery", "Recovery", "#dc2626"],
  ["waiting", "Waiting for capacity", "#ca8a04"],
  ["wasted_progress", "Wasted progress", "#f97316"],
  ["reduced_world", "Smaller world", "#db2777"],
  ["straggler", "Straggler", "#0e7490"],
  ["other", "Other", "#a3a3a3"],
];
const BADPUT = GOODPUT_PARTS.slice(1).map(([key]) => key);

/**
 * One series point -> shares (0..1) of each part. The goodput route's points carry the
 * productive seconds (`productive_s`) and each badput bucket in seconds over the
 * interval [t, t + dt); a point with `goodput` and buckets as shares is taken as is.
 */
export function pointShares(point) {
  const bad = BADPUT.map((key) => Math.max(0, Number(point[key] ?? 0)));
  const badSum = bad.reduce((a, b) => a + b, 0);
  if (typeof point.productive_s !== "number" && typeof point.goodput === "number") {
    return [point.goodput, ...bad];
  }
  const productive = Math.max(0, Number(point.productive_s ?? 0));
  const total = productive + badSum;
  if (!total) return GOODPUT_PARTS.map(() => 0);
  return [productive / total, ...bad.map((v) => v / total)];
}

export class GoodputChart {
  #root;
  #plot;
  #empty;
  #shares = []; // per part, per point
  #resizeObserver;
  #height;

  constructor(root, { height = 220 } = {}) {
    this.#root = root;
    this.#height = height;
    this.#empty = h("p", { class: "chart-empty", hidden: true }, "No goodput series yet.");
    root.append(this.#empty);
    const bars = uPlot.paths.bars({ size: [0.85, 48] });
    // Drawn top of the stack first.
    const order = [...GOODPUT_PARTS.keys()].reverse();
    this.#plot = new uPlot(
      {
        width: Math.max(root.clientWidth, 320),
        height,
        scales: { x: { time: true }, pct: { range: [0, 100] } },
        series: [
          { value: (_u, v) => (v === null ? "\u2014" : localTime(v)) },
          ...order.map((part) => {
            const [, label, colour] = GOODPUT_PARTS[part];
            return {
              label,
              scale: "pct",
              stroke: colour,
              fill: colour,
              width: 0,
              paths: bars,
              points: { show: false },
              value: (_u, _v, _s, idx) => {
                const share = idx === null ? null : this.#shares[part]?.[idx];
                return share === null || share === undefined ? "\u2014" : `${(share * 100).toFixed(1)} %`;
              },
            };
          }),
        ],
        axes: [
          { space: 70, incrs: TIME_INCRS, values: (_u, splits) => splits.map(tickLabel) },
          { scale: "pct", label: "share of time (%)", values: (_u, splits) => splits.map((v) => `${v}%`) },
        ],
      },
      [[], ...order.map(() => [])],
      root,
    );
    this.#order = order;
    this.#resizeObserver = new ResizeObserver(() => {
      const width = Math.max(root.clientWidth, 320);
      if (width !== this.#plot.width) this.#plot.setSize({ width, height: this.#height });
    });
    this.#resizeObserver.observe(root);
  }

  #order;

  /** series: the goodput route's `series` ([{t, goodput, ...buckets}]). */
  setData(series) {
    const points = [...(series ?? [])].filter((p) => typeof p.t === "number").sort((a, b) => a.t - b.t);
    const shares = points.map(pointShares);
    this.#shares = GOODPUT_PARTS.map((_, part) => shares.map((s) => s[part]));
    // Running sums from the bottom, in percent.
    const cumulative = GOODPUT_PARTS.map(() => []);
    for (const s of shares) {
      let sum = 0;
      s.forEach((v, part) => {
        sum += v;
        cumulative[part].push(Math.min(100, sum * 100));
      });
    }
    // A bar stands in the middle of its interval [t, t + dt).
    const xs = points.map((p) => p.t + (p.dt ?? 0) / 2);
    this.#plot.setData([xs, ...this.#order.map((part) => cumulative[part])]);
    this.#empty.hidden = points.length > 0;
    this.#root.dataset.points = String(points.length);
  }

  destroy() {
    this.#resizeObserver.disconnect();
    this.#plot.destroy();
  }
}
