// A live chart of one GPU: utilisation (%) on the left scale, temperature (°C) on the
// right, over a fixed window that slides with the clock. Columnar data, x in Unix
// seconds, null for gaps; new samples are appended and the whole window handed to
// uPlot's setData (as in uPlot's demos/stream-data.html).
import uPlot from "../vendor/uPlot-1.6.32.esm.js";
import { h } from "../lib/dom.js";
import { celsius, localTime, pct } from "../lib/format.js";

const UTIL_COLOUR = "#2563eb";
const TEMP_COLOUR = "#dc2626";

const pad2 = (n) => String(n).padStart(2, "0");

function tickLabel(ts) {
  const d = new Date(ts * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return d.getSeconds() ? `${hm}:${pad2(d.getSeconds())}` : hm;
}

export class GpuChart {
  #root;
  #plot;
  #empty;
  #windowS;
  #height;
  #end = Date.now() / 1000;
  #xs = [];
  #util = [];
  #temp = [];
  #resizeObserver;
  #ticker;

  /** root: an empty element the chart fills. */
  constructor(root, { windowS = 600, height = 280, emptyText = "No samples yet." } = {}) {
    this.#root = root;
    this.#windowS = windowS;
    this.#height = height;
    root.classList.add("gpu-chart");
    this.#empty = h("p", { class: "chart-empty", hidden: true }, emptyText);
    root.append(this.#empty);
    this.#plot = new uPlot(this.#options(), [[], [], []], root);
    this.#resizeObserver = new ResizeObserver(() => this.#fit());
    this.#resizeObserver.observe(root);
    // Slide the window even when nothing arrives, so a silent GPU shows as a growing gap.
    this.#ticker = setInterval(() => this.#redraw(), 2000);
    this.#redraw();
  }

  #options() {
    return {
      width: this.#width(),
      height: this.#height,
      scales: {
        x: { time: true, range: () => [this.#end - this.#windowS, this.#end] },
        pct: { range: [0, 100] },
        degc: {
          range: (_u, min, max) => [Math.min(min ?? 30, 30), Math.max(max ?? 90, 90)],
        },
      },
      series: [
        { value: (_u, v) => (v === null || v === undefined ? "\u2014" : localTime(v)) },
        {
          label: "Utilisation",
          scale: "pct",
          stroke: UTIL_COLOUR,
          width: 2,
          fill: "rgba(37, 99, 235, 0.08)",
          value: (_u, v) => pct(v),
        },
        {
          label: "Temperature",
          scale: "degc",
          stroke: TEMP_COLOUR,
          width: 2,
          value: (_u, v) => celsius(v),
        },
      ],
      axes: [
        {
          // Local wall-clock ticks: minutes, with seconds only when a tick falls inside one.
          space: 70,
          incrs: [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
          values: (_u, splits) => splits.map(tickLabel),
        },
        {
          scale: "pct",
          label: "utilisation (%)",
          stroke: UTIL_COLOUR,
          values: (_u, splits) => splits.map((v) => `${v}%`),
        },
        {
          scale: "degc",
          side: 1,
          label: "temperature (\u00b0C)",
          stroke: TEMP_COLOUR,
          grid: { show: false },
          values: (_u, splits) => splits.map((v) => `${v}\u00b0`),
        },
      ],
    };
  }

  #width() {
    return Math.max(this.#root.clientWidth, 320);
  }

  #fit() {
    const width = this.#width();
    if (width !== this.#plot.width) this.#plot.setSize({ width, height: this.#height });
  }

  /** Replace the data with a history answer's columns ({ts, util, temp_c, ...}). */
  setHistory(columns) {
    const ts = columns?.ts ?? [];
    this.#xs = [];
    this.#util = [];
    this.#temp = [];
    ts.forEach((t, i) => this.#insert(t, columns.util?.[i] ?? null, columns.temp_c?.[i] ?? null));
    this.#redraw();
  }

  /** Append samples ({ts, util, temp_c}); out-of-order ones are put in place. */
  append(samples) {
    for (const s of samples) this.#insert(s.ts, s.util ?? null, s.temp_c ?? null);
    this.#redraw();
  }

  #insert(ts, util, temp) {
    if (typeof ts !== "number") return;
    const xs = this.#xs;
    let i = xs.length;
    while (i > 0 && xs[i - 1] > ts) i--;
    if (i > 0 && xs[i - 1] === ts) return; // already have this instant
    xs.splice(i, 0, ts);
    this.#util.splice(i, 0, util);
    this.#temp.splice(i, 0, temp);
  }

  #redraw() {
    const last = this.#xs.at(-1) ?? 0;
    // An agent clock slightly ahead of ours still shows its newest sample.
    this.#end = Math.max(Date.now() / 1000, last);
    const start = this.#end - this.#windowS;
    let drop = 0;
    while (drop < this.#xs.length && this.#xs[drop] < start) drop++;
    if (drop) {
      this.#xs.splice(0, drop);
      this.#util.splice(0, drop);
      this.#temp.splice(0, drop);
    }
    this.#plot.setData([this.#xs, this.#util, this.#temp]);
    this.#empty.hidden = this.#xs.length > 0;
    // Exposed for tests and for anyone inspecting the page.
    this.#root.dataset.points = String(this.#xs.length);
    this.#root.dataset.lastTs = this.#xs.length ? String(this.lastTs) : "";
  }

  get pointCount() {
    return this.#xs.length;
  }

  get lastTs() {
    return this.#xs.at(-1) ?? null;
  }

  destroy() {
    clearInterval(this.#ticker);
    this.#resizeObserver.disconnect();
    this.#plot.destroy();
    this.#root.replaceChildren();
  }
}
