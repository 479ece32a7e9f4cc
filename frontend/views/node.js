// Node view (#/nodes/<name>[?gpu=<uuid>]): the node's health, its GPUs with their latest
// readings, a live chart of one selected GPU, and the node's recent events.
// Loaded from GET /nodes/<name>, /nodes/<name>/gpus and /gpus/<uuid>/samples, then kept
// current by the `nodes`, `samples` (topic node:<name>) and `event` SSE events.
import { apiGet } from "../api.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { GpuChart } from "../components/gpu-chart.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import {
  celsius,
  mib,
  pct,
  seconds,
  shortUuid,
  simulatedBadge,
  statusBadge,
  timeEl,
  watts,
} from "../lib/format.js";

const WINDOW_S = 600; // the chart shows the last 10 minutes
const HISTORY_POINTS = 300;

export const title = (params) => params.name;

function facts(node) {
  const item = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
  return [
    item("Health", statusBadge(node.status)),
    item("GPUs", String(node.gpu_count ?? 0)),
    item("Avg util", pct(node.util_avg)),
    item("Max temp", celsius(node.temp_max)),
    item("Last seen", timeEl(node.last_seen)),
    item("Clock offset", seconds(node.clock_offset_s)),
    node.last_xid_at ? item("Last XID", timeEl(node.last_xid_at)) : null,
  ];
}

/** One row per GPU; the button keeps its element so focus survives live updates. */
class GpuRow {
  constructor(gpu, onSelect) {
    this.uuid = gpu.uuid;
    this.button = h(
      "button",
      { type: "button", class: "select-gpu", "aria-pressed": "false", onclick: () => onSelect(gpu.uuid) },
      "Show chart",
    );
    this.cells = {
      util: h("td", { class: "num" }),
      temp: h("td", { class: "num" }),
      mem: h("td", { class: "num" }),
      power: h("td", { class: "num" }),
      ts: h("td", {}),
    };
    this.tr = h(
      "tr",
      { dataset: { uuid: gpu.uuid } },
      h("th", { scope: "row", class: "num" }, String(gpu.index)),
      h("td", {}, gpu.name || "\u2014", gpu.simulated ? [" ", simulatedBadge()] : null),
      h("td", { class: "mono", title: gpu.uuid }, shortUuid(gpu.uuid)),
      Object.values(this.cells),
      h("td", {}, this.button),
    );
    this.memoryTotal = gpu.memory_total_mib ?? null;
    this.latest = null;
    this.update(gpu.latest ?? null);
  }

  update(sample) {
    if (sample && this.latest && sample.ts < this.latest.ts) return;
    this.latest = sample;
    const s = sample ?? {};
    this.cells.util.textContent = pct(s.util);
    this.cells.temp.textContent = celsius(s.temp_c);
    this.cells.mem.textContent = mib(s.mem_used_mib, s.mem_total_mib ?? this.memoryTotal);
    this.cells.power.textContent = watts(s.power_w);
    replace(this.cells.ts, sample ? timeEl(sample.ts) : h("span", { class: "muted" }, "no sample yet"));
  }

  select(selected) {
    this.tr.classList.toggle("selected", selected);
    this.button.setAttribute("aria-pressed", String(selected));
    this.button.textContent = selected ? "Charted" : "Show chart";
  }
}

export function mount(root, ctx) {
  const name = ctx.params.name;
  ctx.stream.setTopics(["nodes", "events", `node:${name}`]);

  const header = h("div", { class: "node-header" }, h("h1", {}, name));
  const factList = h("dl", { class: "facts" });
  const gpuStatus = h("div", {}, h("p", { class: "muted" }, "Loading GPUs\u2026"));
  const gpuBody = h("tbody");
  const gpuTable = h(
    "table",
    { class: "gpus-table", hidden: true },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["GPU", "Model", "UUID", "Util", "Temp", "Memory", "Power", "Last sample", "Chart"].map((label, i) =>
          h("th", { scope: "col", class: [0, 3, 4, 5, 6].includes(i) ? "num" : null }, label),
        ),
      ),
    ),
    gpuBody,
  );
  const chartTitle = h("h2", { id: "chart-heading" }, "GPU chart");
  const chartMeta = h("p", { class: "chart-meta muted" });
  const chartStatus = h("div");
  const chartRoot = h("div", { class: "chart-root", id: "gpu-chart", hidden: true });
  const feedRoot = h("div");

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/" }, "Overview"), " / ", name),
    header,
    factList,
    h(
      "section",
      { class: "panel", "aria-labelledby": "gpus-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "gpus-heading" }, "GPUs")),
      gpuStatus,
      h("div", { class: "table-scroll" }, gpuTable),
    ),
    h(
      "section",
      { class: "panel", "aria-labelledby": "chart-heading" },
      h("div", { class: "panel-head" }, chartTitle, chartMeta),
      chartStatus,
      chartRoot,
    ),
    h(
      "section",
      { class: "panel", "aria-labelledby": "node-events-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "node-events-heading" }, "Events on this node")),
      feedRoot,
    ),
  );

  const chart = new GpuChart(chartRoot, {
    windowS: WINDOW_S,
    emptyText: "No samples from this GPU in the last 10 minutes.",
  });
  const rows = new Map(); // uuid -> GpuRow
  let gpus = [];
  let selected = ctx.query.get("gpu");
  let historyRequest = 0;
  let pending = null; // live samples that arrived while the history was loading
  let reloadedForCount = null; // GPU count that last triggered a reload of the inventory

  function showNode(node) {
    replace(header, h("h1", {}, name), node.simulated ? simulatedBadge() : null);
    replace(factList, facts(node));
  }

  function updateChartMeta() {
    const row = rows.get(selected);
    const last = chart.lastTs;
    replace(
      chartMeta,
      "last sample: ",
      last === null
        ? h("span", { class: "last-sample", dataset: { ts: "" } }, "none")
        : h("span", { class: "last-sample", dataset: { ts: String(last) } }, timeEl(last)),
      row ? ` \u00b7 window ${WINDOW_S / 60} min` : null,
    );
  }

  function showGpus(list) {
    gpus = [...list].sort((a, b) => a.index - b.index);
    rows.clear();
    for (const gpu of gpus) rows.set(gpu.uuid, new GpuRow(gpu, selectGpu));
    replace(gpuBody, [...rows.values()].map((row) => row.tr));
    gpuTable.hidden = gpus.length === 0;
    replace(gpuStatus, gpus.length ? null : emptyState("This node has not reported any GPU yet."));
    if (!rows.has(selected)) selected = gpus[0]?.uuid ?? null;
    selectGpu(selected, { force: true });
  }

  function selectGpu(uuid, { force = false } = {}) {
    if (!force && uuid === chartRoot.dataset.uuid) return;
    selected = uuid;
    for (const row of rows.values()) row.select(row.uuid === uuid);
    const gpu = gpus.find((g) => g.uuid === uuid);
    chartRoot.hidden = !gpu;
    if (!gpu) {
      replace(chartTitle, "GPU chart");
      replace(chartStatus, gpus.length ? null : emptyState("No GPU to chart."));
      return;
    }
    replace(
      chartTitle,
      `GPU ${gpu.index}`,
      gpu.name ? ` \u00b7 ${gpu.name}` : null,
      gpu.simulated ? [" ", simulatedBadge()] : null,
    );
    chartRoot.dataset.uuid = uuid;
    chartRoot.dataset.simulated = String(Boolean(gpu.simulated));
    // Keep the selection in the address (without a hashchange) so a reload shows the same GPU.
    const hash = `#/nodes/${encodeURIComponent(name)}?gpu=${encodeURIComponent(uuid)}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
    loadHistory(uuid);
  }

  async function loadHistory(uuid) {
    const request = ++historyRequest;
    pending = [];
    chart.setHistory(null);
    updateChartMeta();
    chartRoot.dataset.loading = "true";
    try {
      const now = Date.now() / 1000;
      const answer = await apiGet(
        `gpus/${encodeURIComponent(uuid)}/samples`,
        { since: Math.floor(now - WINDOW_S), points: HISTORY_POINTS },
        { signal: ctx.signal },
      );
      if (request !== historyRequest) return;
      chart.setHistory(answer.columns);
      chartRoot.dataset.historyPoints = String(chart.pointCount);
      chart.append(pending);
      replace(chartStatus);
    } catch (error) {
      if (error.name === "AbortError" || request !== historyRequest) return;
      replace(chartStatus, errorBox("Could not load the GPU's samples", error));
      chart.append(pending);
    } finally {
      if (request === historyRequest) {
        pending = null;
        delete chartRoot.dataset.loading;
        updateChartMeta();
      }
    }
  }

  async function load() {
    try {
      const [node, list] = await Promise.all([
        apiGet(`nodes/${encodeURIComponent(name)}`, {}, { signal: ctx.signal }),
        apiGet(`nodes/${encodeURIComponent(name)}/gpus`, {}, { signal: ctx.signal }),
      ]);
      showNode(node);
      showGpus(list);
    } catch (error) {
      if (error.name === "AbortError") return;
      if (error.status === 404) {
        replace(factList, emptyState(`Node "${name}" has not reported to this server.`));
        replace(gpuStatus, emptyState("No GPUs known for this node."));
        replace(chartStatus, emptyState("Nothing to chart."));
        chartRoot.hidden = true;
      } else {
        replace(gpuStatus, errorBox("Could not load the node", error));
      }
    }
  }

  load();

  const offNodes = ctx.stream.on("nodes", (list) => {
    const node = (Array.isArray(list) ? list : (list?.nodes ?? [])).find((n) => n.name === name);
    if (node) {
      showNode(node);
      // A GPU this page does not know yet (the node just reported its inventory): reload.
      const count = node.gpu_count ?? 0;
      if (count !== gpus.length && count !== reloadedForCount) {
        reloadedForCount = count;
        load();
      }
    }
  });
  const offSamples = ctx.stream.on("samples", (payload) => {
    if (payload?.node !== name) return;
    const samples = payload.samples ?? [];
    for (const sample of samples) rows.get(sample.uuid)?.update(sample);
    const mine = samples.filter((s) => s.uuid === selected);
    if (mine.length === 0) return;
    if (pending) pending.push(...mine);
    else {
      chart.append(mine);
      updateChartMeta();
    }
  });
  // Samples sent while the stream was down are not replayed: reload the window.
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (reconnected && selected) loadHistory(selected);
  });
  const offFeed = mountEventsFeed(feedRoot, ctx, { node: name, limit: 50 });

  return () => {
    offNodes();
    offSamples();
    offState();
    offFeed();
    chart.destroy();
  };
}
