// A live time-series chart of one GPU over a fixed window that slides with the clock:
// one or two value scales (left, right), any readings of a sample as series. Columnar
// data, x in Unix seconds, null for gaps; new samples are appended and the whole window
// handed to uPlot's setData (as in uPlot's demos/stream-data.html).
// GPU_CHARTS holds the node view's charts: utilisation and temperature, memory, power,
// clocks. The job view's step-time chart uses the same class with its own series.
import uPlot from "../vendor/uPlot-1.6.32.esm.js";
import { h } from "../lib/dom.js";
import { celsius, localTime, pct, watts } from "../lib/format.js";

const pad2 = (n) => String(n).padStart(2, "0");
const DASH = "\u2014";
const missing = (v) => v === null || v === undefined;

// Tick steps of a time axis, never under a second: the labels have a resolution of one
// second, so a finer step (uPlot's default for a range of a few seconds) repeats a label.
export const TIME_INCRS = [
  1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800,
  604800,
];

/** "14:03" on a whole minute, else "14:03:07". */
export function tickLabel(ts) {
  const d = new Date(ts * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return d.getSeconds() ? `${hm}:${pad2(d.getSeconds())}` : hm;
}

const gib = (v) => (missing(v) ? DASH : `${(v / 1024).toFixed(1)} GiB`);
const mhz = (v) => (missing(v) ? DASH : `${Math.round(v)} MHz`);

/**
 * Chart presets of a GPU sample's readings. A scale: {label, side (0 left, 1 right),
 * range (uPlot range), ticks (fn value -> label)}. A series: {key (sample field), label,
 * colour, scale, format, fill}.
 */
export const GPU_CHARTS = {
  utilisation: {
    title: "Utilisation and temperature",
    scales: {
      pct: { label: "utilisation (%)", range: [0, 100], ticks: (v) => `${v}%` },
      degc: {
        label: "temperature (\u00b0C)",
        side: 1,
        range: (_u, min, max) => [Math.min(min ?? 30, 30), Math.max(max ?? 90, 90)],
        ticks: (v) => `${v}\u00b0`,
      },
    },
    series: [
      { key: "util", label: "Utilisation", colour: "#2563eb", scale: "pct", format: pct, fill: true },
      { key: "temp_c", label: "Temperature", colour: "#dc2626", scale: "degc", format: celsius },
    ],
  },
  memory: {
    title: "Memory",
    scales: {
      mib: {
        label: "used (GiB)",
        range: (_u, _min, max) => [0, Math.max(max ?? 1024, 1024) * 1.05],
        // Ticks on whole GiB (the readings are MiB).
        incrs: [1, 2, 4, 8, 10, 16, 20, 32, 40, 64, 80, 160].map((g) => g * 1024),
        ticks: (v) => `${Math.round(v / 1024)}`,
      },
      pct: { label: "copy utilisation (%)", side: 1, range: [0, 100], ticks: (v) => `${v}%` },
    },
    series: [
      { key: "mem_used_mib", label: "Used", colour: "#7c3aed", scale: "mib", format: gib, fill: true },
      { key: "mem_util", label: "Copy util", colour: "#0891b2", scale: "pct", format: pct },
    ],
  },
  power: {
    title: "Power",
    scales: {
      w: {
        label: "power (W)",
        range: (_u, _min, max) => [0, Math.max(max ?? 100, 100) * 1.1],
        ticks: (v) => `${Math.round(v)}`,
      },
      degc: {
        label: "memory temp (\u00b0C)",
        side: 1,
        range: (_u, min, max) => [Math.min(min ?? 30, 30), Math.max(max ?? 90, 90)],
        ticks: (v) => `${v}\u00b0`,
      },
    },
    series: [
      { key: "power_w", label: "Power", colour: "#ea580c", scale: "w", format: watts, fill: true },
      { key: "mem_temp_c", label: "Memory temp", colour: "#be123c", scale: "degc", format: celsius },
    ],
  },
  clocks: {
    title: "Clocks",
    scales: {
      mhz: {
        label: "clock (MHz)",
        range: (_u, _min, max) => [0, Math.max(max ?? 1000, 1000) * 1.1],
        ticks: (v) => `${Math.round(v)}`,
      },
    },
    series: [
      { key: "sm_clock_mhz", label: "SM clock", colour: "#059669", scale: "mhz", format: mhz },
      { key: "mem_clock_mhz", label: "Memory clock", colour: "#a16207", scale: "mhz", format: mhz },
    ],
  },
};

function fillOf(colour) {
  // "#rrggbb" -> a faint fill of the same colour.
  const n = Number.parseInt(colour.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, 0.08)`;
}

export class GpuChart {
  #root;
  #plot;
  #empty;
  #windowS;
  #height;
  #spec;
  #end = Date.now() / 1000;
  #xs = [];
  #ys; // one array per series
  #resizeObserver;
  #ticker;

  /**
   * root: an empty element the chart fills. spec: a GPU_CHARTS entry (or one of the same
   * shape); default: utilisation and temperature.
   */
  constructor(
    root,
    { windowS = 600, height = 280, emptyText = "No samples yet.", spec = GPU_CHARTS.utilisation } = {},
  ) {
    this.#root = root;
    this.#windowS = windowS;
    this.#height = height;
    this.#spec = spec;
    this.#ys = spec.series.map(() => []);
    root.classList.add("gpu-chart");
    this.#empty = h("p", { class: "chart-empty", hidden: true }, emptyText);
    root.append(this.#empty);
    this.#plot = new uPlot(this.#options(), [[], ...this.#ys], root);
    this.#resizeObserver = new ResizeObserver(() => this.#fit());
    this.#resizeObserver.observe(root);
    // Slide the window even when nothing arrives, so a silent GPU shows as a growing gap.
    this.#ticker = setInterval(() => this.#redraw(), 2000);
    this.#redraw();
  }

  #options() {
    const scales = { x: { time: true, range: () => [this.#end - this.#windowS, this.#end] } };
    const axes = [
      {
        // Local wall-clock ticks: minutes, with seconds only when a tick falls inside one.
        space: 70,
        incrs: [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
        values: (_u, splits) => splits.map(tickLabel),
      },
    ];
    for (const [name, scale] of Object.entries(this.#spec.scales)) {
      scales[name] = { range: scale.range };
      const first = this.#spec.series.find((s) => s.scale === name);
      axes.push({
        scale: name,
        side: scale.side === 1 ? 1 : 3,
        label: scale.label,
        stroke: first?.colour,
        grid: { show: scale.side !== 1 },
        incrs: scale.incrs,
        values: (_u, splits) => splits.map(scale.ticks ?? String),
      });
    }
    return {
      width: this.#width(),
      height: this.#height,
      scales,
      series: [
        { value: (_u, v) => (missing(v) ? DASH : localTime(v)) },
        ...this.#spec.series.map((s) => ({
          label: s.label,
          scale: s.scale,
          stroke: s.colour,
          width: 2,
          fill: s.fill ? fillOf(s.colour) : undefined,
          value: (_u, v) => (s.format ? s.format(v) : missing(v) ? DASH : String(v)),
        })),
      ],
      axes,
    };
  }

  #width() {
    return Math.max(this.#root.clientWidth, 280);
  }

  #fit() {
    const width = this.#width();
    if (width !== this.#plot.width) this.#plot.setSize({ width, height: this.#height });
  }

  /** Replace the data with a history answer's columns ({ts, util, temp_c, ...}). */
  setHistory(columns) {
    const ts = columns?.ts ?? [];
    this.#xs = [];
    this.#ys = this.#spec.series.map(() => []);
    ts.forEach((t, i) =>
      this.#insert(
        t,
        this.#spec.series.map((s) => columns[s.key]?.[i] ?? null),
      ),
    );
    this.#redraw();
  }

  /** Append samples (objects with ts and the series' keys); out-of-order ones are put in place. */
  append(samples) {
    for (const sample of samples) {
      this.#insert(
        sample.ts,
        this.#spec.series.map((s) => sample[s.key] ?? null),
      );
    }
    this.#redraw();
  }

  #insert(ts, values) {
    if (typeof ts !== "number") return;
    const xs = this.#xs;
    let i = xs.length;
    while (i > 0 && xs[i - 1] > ts) i--;
    if (i > 0 && xs[i - 1] === ts) return; // already have this instant
    xs.splice(i, 0, ts);
    values.forEach((v, k) => this.#ys[k].splice(i, 0, v));
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
      for (const ys of this.#ys) ys.splice(0, drop);
    }
    this.#plot.setData([this.#xs, ...this.#ys]);
    const drawn = this.#ys.some((ys) => ys.some((v) => !missing(v)));
    this.#empty.hidden = drawn;
    // Exposed for tests and for anyone inspecting the page.
    this.#root.dataset.points = String(this.#xs.length);
    this.#root.dataset.valuePoints = String(
      this.#ys.reduce((n, ys) => n + ys.filter((v) => !missing(v)).length, 0),
    );
    this.#root.dataset.lastTs = this.#xs.length ? String(this.lastTs) : "";
  }

  /** Show the last `windowS` seconds (the caller reloads the history for it). */
  setWindow(windowS) {
    this.#windowS = windowS;
    this.#redraw();
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
