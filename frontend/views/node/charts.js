// The node page's charts of one selected GPU over a chosen window: utilisation and
// temperature, memory, power, clocks; the history first (downsampled on the server), then
// the live samples.
import { GPU_CHARTS, GpuChart } from "../../components/gpu-chart.js";
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { simulatedBadge, timeEl } from "../../lib/format.js";

const WINDOWS = [
  [120, "2 min"],
  [600, "10 min"],
  [3600, "1 h"],
  [21600, "6 h"],
];
export const DEFAULT_WINDOW_S = 600;
const CHARTS = ["utilisation", "memory", "power", "clocks"];

/**
 * windowS: the window asked for (the address's ?window=); onWindow() runs when another is
 * chosen. start() draws the (empty) charts once el is in the document (they measure its
 * width). show(gpu, count): chart this GPU (null: none of count); then loading(),
 * history(columns, pending) or historyFailed(error, pending) with the live samples that
 * arrived meanwhile, and loaded(); live(samples) appends; missing(); destroy().
 */
export function chartsPanel({ windowS: asked, onWindow }) {
  let windowS = WINDOWS.some(([s]) => s === asked) ? asked : DEFAULT_WINDOW_S;
  const title = h("h2", { id: "chart-heading" }, "GPU charts");
  const meta = h("p", { class: "chart-meta muted" });
  const windowSelect = h(
    "select",
    { id: "chart-window" },
    WINDOWS.map(([s, label]) => h("option", { value: String(s), selected: s === windowS }, `last ${label}`)),
  );
  const status = h("div");
  const roots = Object.fromEntries(
    CHARTS.map((key) => [
      key,
      h("div", {
        class: "chart-root chart-small",
        id: key === "utilisation" ? "gpu-chart" : `gpu-chart-${key}`,
        dataset: { chart: key },
      }),
    ]),
  );
  const grid = h(
    "div",
    { class: "chart-grid", hidden: true },
    CHARTS.map((key) => h("figure", { class: "chart-cell" }, h("figcaption", {}, GPU_CHARTS[key].title), roots[key])),
  );
  const el = h(
    "section",
    { class: "panel", "aria-labelledby": "chart-heading" },
    h(
      "div",
      { class: "panel-head" },
      title,
      meta,
      h("div", { class: "filters" }, h("label", { for: "chart-window" }, "Window"), windowSelect),
    ),
    status,
    grid,
  );
  let charts = null; // key -> GpuChart, once started
  let chartList = [];
  const first = roots.utilisation;

  function updateMeta() {
    const last = charts.utilisation.lastTs;
    replace(
      meta,
      "last sample: ",
      last === null
        ? h("span", { class: "last-sample", dataset: { ts: "" } }, "none")
        : h("span", { class: "last-sample", dataset: { ts: String(last) } }, timeEl(last)),
      null,
    );
  }

  windowSelect.addEventListener("change", () => {
    windowS = Number(windowSelect.value);
    for (const chart of chartList) chart.setWindow(windowS);
    onWindow();
  });

  return {
    el,
    windowS: () => windowS,
    /** The GPU the charts show (its uuid), or undefined. */
    shown: () => grid.dataset.uuid,
    start() {
      charts = Object.fromEntries(
        CHARTS.map((key) => [
          key,
          new GpuChart(roots[key], {
            windowS,
            height: 200,
            spec: GPU_CHARTS[key],
            emptyText: "No samples from this GPU in this window.",
          }),
        ]),
      );
      chartList = Object.values(charts);
    },
    show(gpu, count) {
      grid.hidden = !gpu;
      if (!gpu) {
        replace(title, "GPU charts");
        replace(status, count ? null : emptyState("No GPU to chart."));
        return;
      }
      replace(title, `GPU ${gpu.index}`, gpu.name ? ` \u00b7 ${gpu.name}` : null, gpu.simulated ? [" ", simulatedBadge()] : null);
      for (const node of [grid, ...Object.values(roots)]) {
        node.dataset.uuid = gpu.uuid;
        node.dataset.simulated = String(Boolean(gpu.simulated));
      }
    },
    loading() {
      for (const chart of chartList) chart.setHistory(null);
      updateMeta();
      first.dataset.loading = "true";
    },
    history(columns, pending) {
      for (const chart of chartList) chart.setHistory(columns);
      first.dataset.historyPoints = String(charts.utilisation.pointCount);
      for (const chart of chartList) chart.append(pending);
      replace(status);
    },
    historyFailed(error, pending) {
      replace(status, errorBox("Could not load the GPU's samples", error));
      for (const chart of chartList) chart.append(pending);
    },
    loaded() {
      delete first.dataset.loading;
      updateMeta();
    },
    live(samples) {
      for (const chart of chartList) chart.append(samples);
      updateMeta();
    },
    missing() {
      replace(status, emptyState("Nothing to chart."));
      grid.hidden = true;
    },
    destroy() {
      for (const chart of chartList) chart.destroy();
    },
  };
}
