// The job page's Goodput panel: the share of job time that was productive over a chosen
// window, the badput broken down by cause, and both over time as a chart.
import { GOODPUT_PARTS, GoodputChart } from "../../components/goodput-chart.js";
import { h, replace } from "../../lib/dom.js";
import { duration, fraction } from "../../lib/format.js";
import { failure, section, table } from "../../lib/panels.js";

// The time goodput is a share of: the elapsed time less the time waiting for capacity.
function jobTime(g) {
  return Math.max(0, (g.elapsed_s ?? 0) - (g.badput?.waiting ?? 0));
}

function badputTable(g) {
  const badput = g.badput ?? {};
  const elapsed = g.elapsed_s ?? 0;
  return table(
    "badput-table",
    ["", "Part", "Time", "Share"],
    h(
      "tbody",
      {},
      GOODPUT_PARTS.map(([key, label, colour]) => {
        const s = key === "productive" ? g.productive_s : badput[key];
        return h(
          "tr",
          { dataset: { part: key } },
          h("td", {}, h("span", { class: "legend-swatch", style: `background:${colour}` })),
          h("th", { scope: "row" }, label),
          h("td", { class: "num" }, duration(s)),
          h("td", { class: "num" }, elapsed && s !== undefined && s !== null ? fraction(s / elapsed) : "\u2014"),
        );
      }),
    ),
    [2, 3],
  );
}

/**
 * window(): the chosen window (GET /jobs/<job>/goodput?window=); onWindow() runs when it
 * changes. start() draws the (empty) chart once el is in the document; update(goodput);
 * fail(error); destroy().
 */
export function goodputPanel({ onWindow }) {
  const windowSelect = h(
    "select",
    { id: "goodput-window" },
    h("option", { value: "1h" }, "last hour"),
    h("option", { value: "24h", selected: true }, "last 24 h"),
    h("option", { value: "all" }, "whole job"),
  );
  const root = h("div", {}, h("p", { class: "muted" }, "Loading goodput\u2026"));
  const chartRoot = h("div", { class: "chart-root", id: "goodput-chart" });
  const el = section(
    "goodput-heading",
    "Goodput",
    h("div", { class: "filters" }, h("label", { for: "goodput-window" }, "Window"), windowSelect),
    root,
    chartRoot,
  );
  let chart = null;

  windowSelect.addEventListener("change", onWindow);

  return {
    el,
    window: () => windowSelect.value,
    start() {
      chart = new GoodputChart(chartRoot);
    },
    update(g) {
      replace(
        root,
        h(
          "div",
          { class: "goodput-head" },
          h("p", { class: "goodput-big", dataset: { goodput: String(g.goodput ?? "") } }, fraction(g.goodput)),
          h(
            "p",
            { class: "muted" },
            // Time waiting for capacity is not the job's (it holds no GPUs): goodput leaves it out.
            `productive ${duration(g.productive_s)} of ${duration(jobTime(g))} of job time` +
              (g.badput?.waiting ? `; waiting for capacity ${duration(g.badput.waiting)}` : ""),
          ),
        ),
        h("div", { class: "table-scroll" }, badputTable(g)),
      );
      chartRoot.hidden = false;
      chart.setData(g.series ?? []);
    },
    fail(error) {
      chartRoot.hidden = true;
      replace(root, failure("goodput", error, "Goodput accounting is not available on this server yet."));
    },
    destroy() {
      chart.destroy();
    },
  };
}
