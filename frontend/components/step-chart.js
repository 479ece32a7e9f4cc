// The cohort's step time over time: the median across ranks and the worst rank of each
// step (uPlot, x in Unix seconds at the step's first completion). The gap between the two
// lines is what a straggler costs every synchronous step.
import uPlot from "../vendor/uPlot-1.6.32.esm.js";
import { h } from "../lib/dom.js";
import { duration, localTime } from "../lib/format.js";
import { TIME_INCRS, tickLabel } from "./gpu-chart.js";

const DASH = "\u2014";

export class StepChart {
  #root;
  #plot;
  #empty;
  #worstRank = [];
  #steps = [];
  #resizeObserver;
  #height;

  constructor(root, { height = 220 } = {}) {
    this.#root = root;
    this.#height = height;
    this.#empty = h("p", { class: "chart-empty", hidden: true }, "No steps reported yet.");
    root.append(this.#empty);
    this.#plot = new uPlot(
      {
        width: Math.max(root.clientWidth, 320),
        height,
        scales: { x: { time: true }, s: { range: (_u, _min, max) => [0, (max ?? 1) * 1.15] } },
        series: [
          {
            value: (_u, v, _s, idx) =>
              v === null || idx === null ? DASH : `${localTime(v)} \u00b7 step ${this.#steps[idx] ?? "?"}`,
          },
          {
            label: "Median rank",
            scale: "s",
            stroke: "#2563eb",
            width: 2,
            value: (_u, v) => duration(v),
          },
          {
            label: "Worst rank",
            scale: "s",
            stroke: "#dc2626",
            width: 2,
            value: (_u, v, _s, idx) =>
              v === null || idx === null ? DASH : `${duration(v)} (rank ${this.#worstRank[idx]})`,
          },
        ],
        axes: [
          {
            space: 70,
            incrs: TIME_INCRS,
            values: (_u, splits) => {
              const labels = splits.map(tickLabel);
              this.#root.dataset.xTicks = labels.join("|"); // what the axis reads (for tests)
              return labels;
            },
          },
          {
            scale: "s",
            label: "step time (s)",
            values: (_u, splits) => {
              // One number of decimals for the whole axis, enough for its tick spacing.
              const gap = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
              // (sub-millisecond steps too: 0.0004, not five ticks of "0.000")
              const digits = gap >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(gap) - 1e-9));
              return splits.map((v) => v.toFixed(digits));
            },
          },
        ],
      },
      [[], [], []],
      root,
    );
    this.#resizeObserver = new ResizeObserver(() => {
      const width = Math.max(root.clientWidth, 320);
      if (width !== this.#plot.width) this.#plot.setSize({ width, height: this.#height });
    });
    this.#resizeObserver.observe(root);
  }

  /** matrix: a StepMatrix.build() result. */
  setData(matrix) {
    const xs = [];
    let prev = -Infinity;
    for (const col of matrix.columns) {
      // uPlot needs x strictly increasing; two steps done in the same instant are nudged.
      const t = col.t > prev ? col.t : prev + 1e-3;
      xs.push(t);
      prev = t;
    }
    this.#steps = matrix.columns.map((c) => c.step);
    this.#worstRank = matrix.worstRank;
    this.#plot.setData([xs, matrix.median, matrix.worst]);
    this.#empty.hidden = xs.length > 0;
    this.#root.dataset.points = String(xs.length);
  }

  destroy() {
    this.#resizeObserver.disconnect();
    this.#plot.destroy();
  }
}
