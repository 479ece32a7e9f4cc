// Step time per rank as a heatmap: ranks down, steps (in time order) across, one cell per
// (rank, step), drawn on a canvas through an ImageData of one pixel per cell, scaled up
// without smoothing, so thousands of ranks x hundreds of steps draw in a few ms. With more
// ranks than pixel rows, a pixel row shows the slowest of its ranks (a straggler never
// disappears into an average). Colour: the cell's time relative to its step's median
// (default), or the absolute time. Vertical lines mark a new attempt or in-process
// iteration. Hover, or focus the canvas and use the arrow keys, to read a cell.
import { h, replace } from "../lib/dom.js";
import { duration } from "../lib/format.js";

// A yellow-orange-red ramp (ColorBrewer YlOrRd stops), 256 entries.
const STOPS = [
  [255, 255, 204],
  [254, 217, 118],
  [253, 141, 60],
  [227, 26, 28],
  [128, 0, 38],
];
const RAMP = Array.from({ length: 256 }, (_, i) => {
  const x = (i / 255) * (STOPS.length - 1);
  const k = Math.min(Math.floor(x), STOPS.length - 2);
  const f = x - k;
  return STOPS[k].map((v, j) => Math.round(v + (STOPS[k + 1][j] - v) * f));
});
const MISSING = [226, 230, 236];
const MARGIN = { left: 56, right: 8, top: 18, bottom: 26 };
const FLAG_COLOUR = "#0e7490";

function quantile(sorted, q) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.floor(q * (sorted.length - 1))))];
}

export class StepHeatmap {
  #root;
  #canvas;
  #legend;
  #readout;
  #data = null;
  #flagged = new Set();
  #mode = "relative";
  #domain = [1, 1.5];
  #cursor = null; // {row, col}
  #layout = null;
  #bitmap = null; // the cells at one pixel each, rebuilt only when data or mode change
  #resizeObserver;

  constructor(root) {
    this.#root = root;
    this.#canvas = h("canvas", {
      class: "heatmap-canvas",
      tabindex: "0",
      role: "img",
      "aria-label": "step time per rank and step; arrow keys move the cursor",
    });
    this.#legend = h("div", { class: "heatmap-legend" });
    this.#readout = h("p", { class: "heatmap-readout muted", "aria-live": "polite" }, "\u00a0");
    replace(root, this.#canvas, h("div", { class: "heatmap-foot" }, this.#legend, this.#readout));
    this.#canvas.addEventListener("mousemove", (e) => this.#hover(e));
    this.#canvas.addEventListener("mouseleave", () => {
      this.#cursor = null;
      this.draw();
    });
    this.#canvas.addEventListener("keydown", (e) => this.#key(e));
    this.#resizeObserver = new ResizeObserver(() => this.draw());
    this.#resizeObserver.observe(root);
  }

  /** data: a StepMatrix.build() result; flagged: ranks flagged as stragglers. */
  setData(data, flagged = new Set()) {
    this.#data = data;
    this.#flagged = flagged;
    this.#bitmap = null;
    let cells = 0;
    for (const v of data.values) if (!Number.isNaN(v)) cells++;
    this.#root.dataset.cells = String(cells); // (rank, step) cells with a report
    this.#updateDomain();
    this.draw();
  }

  setMode(mode) {
    this.#mode = mode;
    this.#bitmap = null;
    this.#updateDomain();
    this.draw();
  }

  #value(row, col) {
    const d = this.#data;
    const v = d.values[row * d.columns.length + col];
    if (Number.isNaN(v)) return Number.NaN;
    if (this.#mode === "relative") {
      const m = d.median[col];
      return m ? v / m : Number.NaN;
    }
    return v;
  }

  #updateDomain() {
    if (!this.#data) return;
    if (this.#mode === "relative") {
      this.#domain = [1, 1.5];
      return;
    }
    const all = Array.from(this.#data.values).filter((v) => !Number.isNaN(v));
    all.sort((a, b) => a - b);
    const lo = quantile(all, 0.02) ?? 0;
    const hi = quantile(all, 0.98) ?? 1;
    this.#domain = [lo, hi > lo ? hi : lo + 1e-3];
  }

  #colour(v) {
    if (Number.isNaN(v)) return MISSING;
    const [lo, hi] = this.#domain;
    const f = Math.min(1, Math.max(0, (v - lo) / (hi - lo)));
    return RAMP[Math.round(f * 255)];
  }

  draw() {
    const d = this.#data;
    const canvas = this.#canvas;
    const width = Math.max(this.#root.clientWidth, 320);
    const nr = d?.ranks.length ?? 0;
    const nc = d?.columns.length ?? 0;
    const plotH = Math.min(Math.max(nr * 14, 120), 420);
    const height = plotH + MARGIN.top + MARGIN.bottom;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const plotW = width - MARGIN.left - MARGIN.right;
    this.#layout = { plotW, plotH, nr, nc };
    this.#root.dataset.ranks = String(nr);
    this.#root.dataset.steps = String(nc);
    if (!nr || !nc) return;

    if (!this.#bitmap) this.#bitmap = this.#render(plotH);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.#bitmap, MARGIN.left, MARGIN.top, plotW, plotH);
    this.#drawAxes(ctx, plotW, plotH);
  }

  /** One pixel per cell, or per group of ranks when they outnumber the pixel rows (then
   * the slowest of the group is shown). */
  #render(plotH) {
    const nr = this.#data.ranks.length;
    const nc = this.#data.columns.length;
    const rowsPerPx = Math.max(1, Math.ceil(nr / plotH));
    const imgRows = Math.ceil(nr / rowsPerPx);
    const image = new ImageData(nc, imgRows);
    for (let r = 0; r < imgRows; r++) {
      for (let c = 0; c < nc; c++) {
        let v = Number.NaN;
        for (let k = r * rowsPerPx; k < Math.min(nr, (r + 1) * rowsPerPx); k++) {
          const x = this.#value(k, c);
          if (!Number.isNaN(x) && (Number.isNaN(v) || x > v)) v = x;
        }
        const [R, G, B] = this.#colour(v);
        const o = (r * nc + c) * 4;
        image.data[o] = R;
        image.data[o + 1] = G;
        image.data[o + 2] = B;
        image.data[o + 3] = 255;
      }
    }
    this.#root.dataset.pixelRows = String(imgRows); // fewer than ranks: rows share a pixel
    const bitmap = document.createElement("canvas");
    bitmap.width = nc;
    bitmap.height = imgRows;
    bitmap.getContext("2d").putImageData(image, 0, 0);
    return bitmap;
  }

  #drawAxes(ctx, plotW, plotH) {
    const d = this.#data;
    const nr = d.ranks.length;
    const nc = d.columns.length;
    const colX = (c) => MARGIN.left + (c / nc) * plotW;
    const rowY = (r) => MARGIN.top + (r / nr) * plotH;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";

    // Generation boundaries: a new attempt (launcher restart) or iteration (in-process).
    ctx.strokeStyle = "#111827";
    ctx.fillStyle = "#111827";
    ctx.lineWidth = 1.5;
    for (let c = 1; c < nc; c++) {
      const a = d.columns[c - 1];
      const b = d.columns[c];
      if (a.attempt === b.attempt && a.iteration === b.iteration) continue;
      const x = Math.round(colX(c)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, MARGIN.top - 4);
      ctx.lineTo(x, MARGIN.top + plotH);
      ctx.stroke();
      ctx.textAlign = "left";
      ctx.fillText(
        a.attempt !== b.attempt ? `attempt ${b.attempt}` : `iteration ${b.iteration}`,
        x + 3,
        MARGIN.top - 9,
      );
    }

    // Rank axis: a few labels, and a mark beside every flagged straggler.
    ctx.textAlign = "right";
    ctx.fillStyle = "#5b6675";
    const every = Math.max(1, Math.ceil(nr / Math.max(2, Math.floor(plotH / 16))));
    for (let r = 0; r < nr; r += every) {
      ctx.fillText(String(d.ranks[r]), MARGIN.left - 12, rowY(r + 0.5));
    }
    ctx.fillStyle = FLAG_COLOUR;
    d.ranks.forEach((rank, r) => {
      if (!this.#flagged.has(rank)) return;
      const y = rowY(r + 0.5);
      ctx.beginPath();
      ctx.moveTo(MARGIN.left - 9, y - 4);
      ctx.lineTo(MARGIN.left - 2, y);
      ctx.lineTo(MARGIN.left - 9, y + 4);
      ctx.fill();
    });

    // Step axis: step numbers under a few columns.
    ctx.fillStyle = "#5b6675";
    ctx.textAlign = "center";
    const colEvery = Math.max(1, Math.ceil(nc / Math.max(2, Math.floor(plotW / 60))));
    for (let c = 0; c < nc; c += colEvery) {
      ctx.fillText(String(d.columns[c].step), colX(c + 0.5), MARGIN.top + plotH + 13);
    }

    if (this.#cursor) {
      const { row, col } = this.#cursor;
      ctx.strokeStyle = "#1d4ed8";
      ctx.lineWidth = 2;
      const x0 = colX(col);
      const y0 = rowY(row);
      ctx.strokeRect(x0 - 1, y0 - 1, Math.max(plotW / nc, 2) + 2, Math.max(plotH / nr, 2) + 2);
    }
    this.#drawLegend();
  }

  #drawLegend() {
    const [lo, hi] = this.#domain;
    const fmt = (v) => (this.#mode === "relative" ? `${v.toFixed(2)}\u00d7 median` : duration(v));
    const bar = h("span", { class: "legend-ramp", "aria-hidden": "true" });
    bar.style.background = `linear-gradient(90deg, ${STOPS.map((c) => `rgb(${c.join(",")})`).join(", ")})`;
    replace(
      this.#legend,
      h("span", {}, fmt(lo)),
      bar,
      h("span", {}, `\u2265 ${fmt(hi)}`),
      h("span", { class: "legend-missing", "aria-hidden": "true" }),
      h("span", {}, "no report"),
      this.#flagged.size ? [h("span", { class: "legend-flag", "aria-hidden": "true" }, "\u25b6"), h("span", {}, "flagged straggler")] : null,
    );
  }

  #cellAt(event) {
    const l = this.#layout;
    if (!l?.nr || !l?.nc) return null;
    const rect = this.#canvas.getBoundingClientRect();
    const x = event.clientX - rect.left - MARGIN.left;
    const y = event.clientY - rect.top - MARGIN.top;
    if (x < 0 || y < 0 || x >= l.plotW || y >= l.plotH) return null;
    return { row: Math.floor((y / l.plotH) * l.nr), col: Math.floor((x / l.plotW) * l.nc) };
  }

  #hover(event) {
    const cell = this.#cellAt(event);
    this.#cursor = cell;
    this.draw();
    if (cell) this.#describe(cell);
  }

  #describe({ row, col }) {
    const d = this.#data;
    const column = d.columns[col];
    const raw = d.values[row * d.columns.length + col];
    const rank = d.ranks[row];
    const gen = `attempt ${column.attempt}, iteration ${column.iteration}`;
    const text = Number.isNaN(raw)
      ? `rank ${rank} \u00b7 step ${column.step} (${gen}) \u00b7 no report`
      : `rank ${rank} \u00b7 step ${column.step} (${gen}) \u00b7 ${duration(raw)} \u00b7 ` +
        `${(raw / d.median[col]).toFixed(2)}\u00d7 the median ${duration(d.median[col])}` +
        (this.#flagged.has(rank) ? " \u00b7 flagged straggler" : "");
    this.#readout.textContent = text;
  }

  #key(event) {
    const l = this.#layout;
    if (!l?.nr || !l?.nc) return;
    const cur = this.#cursor ?? { row: 0, col: l.nc - 1 };
    const move = {
      ArrowUp: [-1, 0],
      ArrowDown: [1, 0],
      ArrowLeft: [0, -1],
      ArrowRight: [0, 1],
      PageUp: [-10, 0],
      PageDown: [10, 0],
      Home: [0, -l.nc],
      End: [0, l.nc],
    }[event.key];
    if (!move) return;
    event.preventDefault();
    const row = Math.min(l.nr - 1, Math.max(0, cur.row + (this.#cursor ? move[0] : 0)));
    const col = Math.min(l.nc - 1, Math.max(0, cur.col + (this.#cursor ? move[1] : 0)));
    this.#cursor = { row, col };
    this.draw();
    this.#describe(this.#cursor);
  }

  destroy() {
    this.#resizeObserver.disconnect();
  }
}
