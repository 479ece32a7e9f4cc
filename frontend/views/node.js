// Node view (#/nodes/<name>[?gpu=<uuid>]): the node's health; its cordon (who or what
// cordoned it, why, the incident and its evidence, since when, whether it is flagged for
// repair), the history of its cordons, and cordon / readmit (operator, with a reason); its
// GPUs with their latest readings and error counters, live charts of one selected GPU
// (utilisation and temperature, memory, power, clocks), its XID history with the
// catalog's meaning and action, the ranks it hosts, and its recent events.
// Loaded from GET /nodes/<name>, /nodes/<name>/cordons, /nodes/<name>/gpus,
// /gpus/<uuid>/samples, /events and /jobs/<job>, then kept current by the `nodes`,
// `samples` (topic node:<name>) and `event` SSE events.
import { apiGet } from "../api.js";
import { CordonPanel } from "../components/cordon-panel.js";
import { mountEventsFeed, repeatsCatalog, xidLabel } from "../components/events-feed.js";
import { GPU_CHARTS, GpuChart } from "../components/gpu-chart.js";
import { repairBadge } from "../lib/cordons.js";
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
import { loadXidCatalog } from "../lib/xids.js";

const WINDOWS = [
  [120, "2 min"],
  [600, "10 min"],
  [3600, "1 h"],
  [21600, "6 h"],
];
const DEFAULT_WINDOW_S = 600;
const HISTORY_POINTS = 300;
const RANKS_EVERY_S = 10; // how often the hosted ranks are re-read
const RECENT_JOB_S = 3600; // jobs seen within this window are searched for ranks
const MAX_JOBS_SCANNED = 20;
const CHARTS = ["utilisation", "memory", "power", "clocks"];

// Error counters of a sample: [field, label, bad (any non-zero value is a fault)].
const COUNTERS = [
  ["ecc_sbe_volatile", "ECC SBE", false],
  ["ecc_dbe_volatile", "ECC DBE", true],
  ["remapped_correctable", "Remapped rows (corr.)", false],
  ["remapped_uncorrectable", "Remapped rows (uncorr.)", true],
  ["remap_pending", "Remap pending", true],
  ["remap_failure", "Remap failure", true],
  ["pcie_replay", "PCIe replays", false],
];

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

function counterText(value) {
  if (value === null || value === undefined) return "\u2014";
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

/** One row per GPU in each table; the button keeps its element so focus survives updates. */
class GpuRow {
  constructor(gpu, onSelect) {
    this.uuid = gpu.uuid;
    this.index = gpu.index;
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
    this.counterCells = COUNTERS.map(([field]) => h("td", { class: "num", dataset: { field } }));
    this.counterTr = h(
      "tr",
      { dataset: { uuid: gpu.uuid } },
      h("th", { scope: "row", class: "num" }, String(gpu.index)),
      this.counterCells,
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
    COUNTERS.forEach(([field, , bad], i) => {
      const cell = this.counterCells[i];
      cell.textContent = counterText(s[field]);
      cell.classList.toggle("counter-bad", Boolean(bad && s[field]));
      cell.classList.toggle("counter-warn", Boolean(!bad && s[field]));
    });
  }

  select(selected) {
    this.tr.classList.toggle("selected", selected);
    this.button.setAttribute("aria-pressed", String(selected));
    this.button.textContent = selected ? "Charted" : "Show chart";
  }
}

function table(className, headers, body, numeric = []) {
  return h(
    "table",
    { class: className },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        headers.map((label, i) => h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, label)),
      ),
    ),
    body,
  );
}

export function mount(root, ctx) {
  const name = ctx.params.name;
  ctx.stream.setTopics(["nodes", "events", `node:${name}`]);

  const cordonPanel = new CordonPanel({
    name,
    signal: ctx.signal,
    show: (next) => showNode(next),
    reload: () => load(),
  });
  const header = h("div", { class: "node-header" }, h("h1", {}, name));
  const factList = h("dl", { class: "facts" });
  const gpuStatus = h("div", {}, h("p", { class: "muted" }, "Loading GPUs\u2026"));
  const gpuBody = h("tbody");
  const gpuTable = table(
    "gpus-table",
    ["GPU", "Model", "UUID", "Util", "Temp", "Memory", "Power", "Last sample", "Chart"],
    gpuBody,
    [0, 3, 4, 5, 6],
  );
  gpuTable.hidden = true;
  const counterBody = h("tbody");
  const counterTable = table(
    "counters-table",
    ["GPU", ...COUNTERS.map(([, label]) => label)],
    counterBody,
    COUNTERS.map((_, i) => i),
  );
  counterTable.hidden = true;
  const chartTitle = h("h2", { id: "chart-heading" }, "GPU charts");
  const chartMeta = h("p", { class: "chart-meta muted" });
  let windowS = Number(ctx.query.get("window")) || DEFAULT_WINDOW_S;
  if (!WINDOWS.some(([s]) => s === windowS)) windowS = DEFAULT_WINDOW_S;
  const windowSelect = h(
    "select",
    { id: "chart-window" },
    WINDOWS.map(([s, label]) => h("option", { value: String(s), selected: s === windowS }, `last ${label}`)),
  );
  const chartStatus = h("div");
  const chartRoots = Object.fromEntries(
    CHARTS.map((key) => [
      key,
      h("div", {
        class: "chart-root chart-small",
        id: key === "utilisation" ? "gpu-chart" : `gpu-chart-${key}`,
        dataset: { chart: key },
      }),
    ]),
  );
  const chartGrid = h(
    "div",
    { class: "chart-grid", hidden: true },
    CHARTS.map((key) =>
      h("figure", { class: "chart-cell" }, h("figcaption", {}, GPU_CHARTS[key].title), chartRoots[key]),
    ),
  );
  const xidStatus = h("div", {}, h("p", { class: "muted" }, "Loading XIDs\u2026"));
  const xidBody = h("tbody");
  const xidTable = table("xid-table", ["Time", "GPU", "XID", "Message"], xidBody);
  xidTable.hidden = true;
  const ranksStatus = h("div", {}, h("p", { class: "muted" }, "Looking for ranks\u2026"));
  const ranksBody = h("tbody");
  const ranksTable = table(
    "ranks-table",
    ["Job", "Rank", "Local", "PID", "Attempt", "Iteration", "Last step", "Alive", "Heartbeat"],
    ranksBody,
    [1, 2, 3, 4, 5, 6],
  );
  ranksTable.hidden = true;
  const feedRoot = h("div");

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/" }, "Overview"), " / ", name),
    h("div", { class: "title-row" }, header, h("span", { class: "spacer" }), cordonPanel.cordonButton),
    factList,
    cordonPanel.el,
    h(
      "section",
      { class: "panel", "aria-labelledby": "gpus-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "gpus-heading" }, "GPUs")),
      gpuStatus,
      h("div", { class: "table-scroll" }, gpuTable),
      h("h3", { class: "sub-heading" }, "Error counters (latest sample)"),
      h("div", { class: "table-scroll" }, counterTable),
    ),
    h(
      "section",
      { class: "panel", "aria-labelledby": "chart-heading" },
      h(
        "div",
        { class: "panel-head" },
        chartTitle,
        chartMeta,
        h("div", { class: "filters" }, h("label", { for: "chart-window" }, "Window"), windowSelect),
      ),
      chartStatus,
      chartGrid,
    ),
    h(
      "div",
      { class: "two-col" },
      h(
        "section",
        { class: "panel", "aria-labelledby": "xid-heading" },
        h("div", { class: "panel-head" }, h("h2", { id: "xid-heading" }, "XID history")),
        xidStatus,
        h("div", { class: "table-scroll" }, xidTable),
      ),
      h(
        "section",
        { class: "panel", "aria-labelledby": "ranks-heading" },
        h("div", { class: "panel-head" }, h("h2", { id: "ranks-heading" }, "Ranks on this node")),
        ranksStatus,
        h("div", { class: "table-scroll" }, ranksTable),
      ),
    ),
    h(
      "section",
      { class: "panel", "aria-labelledby": "node-events-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "node-events-heading" }, "Events on this node")),
      feedRoot,
    ),
  );

  const charts = Object.fromEntries(
    CHARTS.map((key) => [
      key,
      new GpuChart(chartRoots[key], {
        windowS,
        height: 200,
        spec: GPU_CHARTS[key],
        emptyText: "No samples from this GPU in this window.",
      }),
    ]),
  );
  const chartList = Object.values(charts);
  const rows = new Map(); // uuid -> GpuRow
  let gpus = [];
  let node = null;
  let selected = ctx.query.get("gpu");
  let historyRequest = 0;
  let pending = null; // live samples that arrived while the history was loading
  let reloadedForCount = null; // GPU count that last triggered a reload of the inventory

  // --- header, cordon ---------------------------------------------------------------

  function showNode(next) {
    node = next;
    replace(
      header,
      h("h1", {}, name),
      node.simulated ? simulatedBadge() : null,
      node.repair ? repairBadge(node) : null,
    );
    replace(
      factList,
      facts(node),
      stragglerText
        ? h("div", { class: "straggler-fact" }, h("dt", {}, "Straggler"), h("dd", { class: "status-straggler" }, stragglerText))
        : null,
    );
    cordonPanel.update(node);
  }

  // --- GPUs and charts --------------------------------------------------------------

  function updateChartMeta() {
    const last = charts.utilisation.lastTs;
    replace(
      chartMeta,
      "last sample: ",
      last === null
        ? h("span", { class: "last-sample", dataset: { ts: "" } }, "none")
        : h("span", { class: "last-sample", dataset: { ts: String(last) } }, timeEl(last)),
      null,
    );
  }

  function showGpus(list) {
    gpus = [...list].sort((a, b) => a.index - b.index);
    rows.clear();
    for (const gpu of gpus) rows.set(gpu.uuid, new GpuRow(gpu, selectGpu));
    replace(gpuBody, [...rows.values()].map((row) => row.tr));
    replace(counterBody, [...rows.values()].map((row) => row.counterTr));
    gpuTable.hidden = gpus.length === 0;
    counterTable.hidden = gpus.length === 0;
    replace(gpuStatus, gpus.length ? null : emptyState("This node has not reported any GPU yet."));
    if (!rows.has(selected)) selected = gpus[0]?.uuid ?? null;
    selectGpu(selected, { force: true });
    renderXids(); // the XID rows name GPUs by index
  }

  function selectGpu(uuid, { force = false } = {}) {
    if (!force && uuid === chartGrid.dataset.uuid) return;
    selected = uuid;
    for (const row of rows.values()) row.select(row.uuid === uuid);
    const gpu = gpus.find((g) => g.uuid === uuid);
    chartGrid.hidden = !gpu;
    if (!gpu) {
      replace(chartTitle, "GPU charts");
      replace(chartStatus, gpus.length ? null : emptyState("No GPU to chart."));
      return;
    }
    replace(
      chartTitle,
      `GPU ${gpu.index}`,
      gpu.name ? ` \u00b7 ${gpu.name}` : null,
      gpu.simulated ? [" ", simulatedBadge()] : null,
    );
    for (const el of [chartGrid, ...Object.values(chartRoots)]) {
      el.dataset.uuid = uuid;
      el.dataset.simulated = String(Boolean(gpu.simulated));
    }
    keepInAddress();
    loadHistory(uuid);
  }

  // Keep the GPU and the window in the address (without a hashchange), so a reload shows
  // the same charts.
  function keepInAddress() {
    const q = new URLSearchParams({ gpu: selected ?? "" });
    if (windowS !== DEFAULT_WINDOW_S) q.set("window", String(windowS));
    const hash = `#/nodes/${encodeURIComponent(name)}?${q}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  windowSelect.addEventListener("change", () => {
    windowS = Number(windowSelect.value);
    for (const chart of chartList) chart.setWindow(windowS);
    keepInAddress();
    if (selected) loadHistory(selected);
  });

  async function loadHistory(uuid) {
    const request = ++historyRequest;
    pending = [];
    for (const chart of chartList) chart.setHistory(null);
    updateChartMeta();
    const first = chartRoots.utilisation;
    first.dataset.loading = "true";
    try {
      const now = Date.now() / 1000;
      const answer = await apiGet(
        `gpus/${encodeURIComponent(uuid)}/samples`,
        { since: Math.floor(now - windowS), points: HISTORY_POINTS },
        { signal: ctx.signal },
      );
      if (request !== historyRequest) return;
      for (const chart of chartList) chart.setHistory(answer.columns);
      first.dataset.historyPoints = String(charts.utilisation.pointCount);
      for (const chart of chartList) chart.append(pending);
      replace(chartStatus);
    } catch (error) {
      if (error.name === "AbortError" || request !== historyRequest) return;
      replace(chartStatus, errorBox("Could not load the GPU's samples", error));
      for (const chart of chartList) chart.append(pending);
    } finally {
      if (request === historyRequest) {
        pending = null;
        delete first.dataset.loading;
        updateChartMeta();
      }
    }
  }

  /** Read the node and its GPUs; false when the answer still predates our own cordon change. */
  async function load() {
    try {
      const [answer, list] = await Promise.all([
        apiGet(`nodes/${encodeURIComponent(name)}`, {}, { signal: ctx.signal }),
        apiGet(`nodes/${encodeURIComponent(name)}/gpus`, {}, { signal: ctx.signal }),
      ]);
      if (cordonPanel.stale(answer)) return false; // predates our own cordon change
      showNode(answer);
      showGpus(list);
      return true;
    } catch (error) {
      if (error.name === "AbortError") return false;
      if (error.status === 404) {
        replace(factList, emptyState(`Node "${name}" has not reported to this server.`));
        replace(gpuStatus, emptyState("No GPUs known for this node."));
        replace(chartStatus, emptyState("Nothing to chart."));
        chartGrid.hidden = true;
        counterTable.hidden = true;
      } else {
        replace(gpuStatus, errorBox("Could not load the node", error));
      }
      return false;
    }
  }

  // --- XID history ------------------------------------------------------------------

  let xids = [];
  let catalog = new Map();

  function renderXids() {
    const indexOf = new Map(gpus.map((g) => [g.uuid, g.index]));
    replace(
      xidBody,
      xids.map((event) =>
        h(
          "tr",
          { dataset: { eventId: String(event.id ?? ""), xid: String(event.xid) } },
          h("td", {}, timeEl(event.ts)),
          h(
            "td",
            { class: "mono", title: event.gpu_uuid ?? "" },
            indexOf.has(event.gpu_uuid) ? `GPU ${indexOf.get(event.gpu_uuid)}` : shortUuid(event.gpu_uuid) || "\u2014",
          ),
          h("td", { class: "xid-cell wrap" }, xidLabel(event.xid, catalog)),
          h(
            "td",
            { class: "wrap" },
            event.message && !repeatsCatalog(event.message, event.xid, catalog) ? event.message : "",
          ),
        ),
      ),
    );
    xidTable.hidden = xids.length === 0;
    replace(xidStatus, xids.length ? null : emptyState("No XID errors reported by this node."));
  }

  async function loadXids() {
    try {
      const list = await apiGet("events", { node: name, kind: "xid", limit: 100 }, { signal: ctx.signal });
      const known = new Set(xids.map((e) => e.id));
      xids = [...xids, ...list.filter((e) => !known.has(e.id))].sort((a, b) => b.ts - a.ts).slice(0, 100);
      renderXids();
    } catch (error) {
      if (error.name !== "AbortError") replace(xidStatus, errorBox("Could not load XIDs", error));
    }
  }

  // --- ranks hosted, straggler flags --------------------------------------------------

  let ranksReadAt = 0;
  let stragglerText = null; // what the stragglers route says about this node, if anything

  async function loadStragglerFlags() {
    try {
      const report = await apiGet(`nodes/${encodeURIComponent(name)}/stragglers`, {}, { signal: ctx.signal });
      const parts = (report.jobs ?? []).map((j) =>
        j.node_flagged
          ? `the whole node in ${j.job}`
          : `rank${j.ranks.length === 1 ? "" : "s"} ${j.ranks.map((r) => r.rank).join(", ")} of ${j.job}`,
      );
      stragglerText = parts.length ? `flagged: ${parts.join("; ")}` : null;
    } catch (error) {
      if (error.name === "AbortError") return;
      stragglerText = null; // no such route on this server, or no flag: nothing to say
    }
    if (node) showNode(node);
  }

  async function loadRanks() {
    ranksReadAt = Date.now() / 1000;
    loadStragglerFlags();
    try {
      const jobs = await apiGet("jobs", {}, { signal: ctx.signal });
      const recent = jobs
        .filter((j) => j.last_seen >= ranksReadAt - RECENT_JOB_S)
        .slice(0, MAX_JOBS_SCANNED);
      const details = await Promise.all(
        recent.map((j) =>
          apiGet(`jobs/${encodeURIComponent(j.name)}`, {}, { signal: ctx.signal }).catch((error) => {
            if (error.name === "AbortError") throw error;
            return null;
          }),
        ),
      );
      const hosted = [];
      for (const job of details) {
        for (const rank of job?.ranks ?? []) {
          if (rank.node === name) hosted.push({ job: job.name, ...rank });
        }
      }
      replace(
        ranksBody,
        hosted.map((r) =>
          h(
            "tr",
            { dataset: { job: r.job, rank: String(r.rank) } },
            h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(r.job)}` }, r.job)),
            h("td", { class: "num" }, String(r.rank)),
            h("td", { class: "num" }, String(r.local_rank ?? "\u2014")),
            h("td", { class: "num mono" }, String(r.pid ?? "\u2014")),
            h("td", { class: "num" }, String(r.attempt ?? 0)),
            h("td", { class: "num" }, String(r.iteration ?? 0)),
            h("td", { class: "num" }, r.last_step ?? "\u2014"),
            h("td", {}, r.alive ? "yes" : h("strong", { class: "bad" }, "no")),
            h("td", {}, timeEl(r.last_heartbeat)),
          ),
        ),
      );
      ranksTable.hidden = hosted.length === 0;
      replace(
        ranksStatus,
        hosted.length
          ? null
          : emptyState(
              recent.length
                ? "No rank of a recent job runs on this node."
                : "No job has reported in the last hour.",
            ),
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(ranksStatus, errorBox("Could not load the ranks", error));
    }
  }

  load();
  loadXids();
  loadRanks();
  loadXidCatalog().then((entries) => {
    if (ctx.signal.aborted) return;
    catalog = entries;
    renderXids();
  });

  const offNodes = ctx.stream.on("nodes", (list) => {
    const found = (Array.isArray(list) ? list : (list?.nodes ?? [])).find((n) => n.name === name);
    // A tick read just before our own cordon change may still arrive: skip it.
    if (found && !cordonPanel.stale(found)) {
      showNode(found);
      // A GPU this page does not know yet (the node just reported its inventory): reload.
      const count = found.gpu_count ?? 0;
      if (count !== gpus.length && count !== reloadedForCount) {
        reloadedForCount = count;
        load();
      }
    }
    if (Date.now() / 1000 - ranksReadAt >= RANKS_EVERY_S) loadRanks();
  });
  const offSamples = ctx.stream.on("samples", (payload) => {
    if (payload?.node !== name) return;
    const samples = payload.samples ?? [];
    for (const sample of samples) rows.get(sample.uuid)?.update(sample);
    const mine = samples.filter((s) => s.uuid === selected);
    if (mine.length === 0) return;
    if (pending) pending.push(...mine);
    else {
      for (const chart of chartList) chart.append(mine);
      updateChartMeta();
    }
  });
  const offEvents = ctx.stream.on("event", (event) => {
    if (event.node !== name || event.kind !== "xid") return;
    if (xids.some((e) => e.id === event.id)) return;
    xids = [event, ...xids].sort((a, b) => b.ts - a.ts).slice(0, 100);
    renderXids();
  });
  // Samples and events sent while the stream was down are not replayed: reload them.
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (!reconnected) return;
    if (selected) loadHistory(selected);
    loadXids();
  });
  const offFeed = mountEventsFeed(feedRoot, ctx, { node: name, limit: 50 });

  return () => {
    offNodes();
    offSamples();
    offEvents();
    offState();
    offFeed();
    for (const chart of chartList) chart.destroy();
  };
}
