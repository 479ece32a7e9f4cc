// The job page's "Step time per rank" panel: the heatmap of every rank's step time over
// the steps (relative to the step's median, or absolute), with the straggler ranks
// marked, and the line chart of the cohort's median and worst rank per step.
import { StepHeatmap } from "../../components/heatmap.js";
import { StepChart } from "../../components/step-chart.js";
import { emptyState, h, replace } from "../../lib/dom.js";
import { failure, section } from "../../lib/panels.js";

/**
 * start() draws the (empty) charts once el is in the document (they measure its width);
 * draw(matrix, flagged) shows a StepMatrix with the flagged ranks; reflag(matrix, flagged)
 * marks other ranks on the heatmap; fail(error) the read failed; destroy().
 */
export function stepsPanel() {
  const modeSelect = h(
    "select",
    { id: "heatmap-mode" },
    h("option", { value: "relative" }, "relative to the step's median"),
    h("option", { value: "absolute" }, "absolute time"),
  );
  const status = h("div");
  const heatmapRoot = h("div", { class: "heatmap", id: "step-heatmap" });
  const chartRoot = h("div", { class: "chart-root", id: "step-chart" });
  const el = section(
    "steps-heading",
    "Step time per rank",
    h("div", { class: "filters" }, h("label", { for: "heatmap-mode" }, "Colour"), modeSelect),
    status,
    heatmapRoot,
    h("h3", { class: "sub-heading" }, "Median and worst rank per step"),
    chartRoot,
  );
  let heatmap = null;
  let chart = null;

  modeSelect.addEventListener("change", () => heatmap.setMode(modeSelect.value));

  return {
    el,
    start() {
      heatmap = new StepHeatmap(heatmapRoot);
      chart = new StepChart(chartRoot);
    },
    draw(matrix, flagged) {
      const started = performance.now();
      const built = matrix.build();
      heatmap.setData(built, flagged);
      chart.setData(built);
      // How long building and drawing the steps took (read by the benchmark).
      heatmapRoot.dataset.drawMs = (performance.now() - started).toFixed(1);
      if (!performance.getEntriesByName("trainguard:job-steps").length && built.columns.length) {
        requestAnimationFrame(() => performance.mark("trainguard:job-steps"));
      }
      replace(
        status,
        built.columns.length
          ? null
          : emptyState("No step has been reported yet (the training script reports steps through the trainguard SDK)."),
      );
    },
    reflag(matrix, flagged) {
      heatmap.setData(matrix.build(), flagged);
    },
    fail(error) {
      replace(status, failure("the steps", error, "Step timings are not available on this server."));
    },
    destroy() {
      heatmap.destroy();
      chart.destroy();
    },
  };
}
