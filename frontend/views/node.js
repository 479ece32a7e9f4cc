// Node view (#/nodes/<name>[?gpu=<uuid>]): the node's health; its cordon (who or what
// cordoned it, why, the incident and its evidence, since when, whether it is flagged for
// repair), the history of its cordons, and cordon / readmit (operator, with a reason); its
// GPUs with their latest readings and error counters, live charts of one selected GPU
// (utilisation and temperature, memory, power, clocks), its XID history with the
// catalog's meaning and action, the ranks it hosts, and its recent events.
// Loaded from GET /nodes/<name>, /nodes/<name>/cordons, /nodes/<name>/gpus,
// /gpus/<uuid>/samples, /events and /jobs/<job>, then kept current by the `nodes`,
// `samples` (topic node:<name>) and `event` SSE events.
//
// This module reads, lays out, keeps the charted GPU in the address and follows the live
// stream; each panel (views/node/) builds its own elements (`el`) and shows what it is
// given (`update`, `fail`).
import { apiGet } from "../api.js";
import { CordonPanel } from "../components/cordon-panel.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { h, replace } from "../lib/dom.js";
import { section } from "../lib/panels.js";
import { loadXidCatalog } from "../lib/xids.js";
import { chartsPanel, DEFAULT_WINDOW_S } from "./node/charts.js";
import { gpusPanel } from "./node/gpus.js";
import { nodeHeader } from "./node/header.js";
import { ranksPanel } from "./node/ranks.js";
import { xidsPanel } from "./node/xids.js";

const HISTORY_POINTS = 300;
const RANKS_EVERY_S = 10; // how often the hosted ranks are re-read
const RECENT_JOB_S = 3600; // jobs seen within this window are searched for ranks
const MAX_JOBS_SCANNED = 20;
const MAX_XIDS = 100;

export const title = (params) => params.name;

export function mount(root, ctx) {
  const name = ctx.params.name;
  ctx.stream.setTopics(["nodes", "events", `node:${name}`]);

  const cordonPanel = new CordonPanel({
    name,
    signal: ctx.signal,
    show: (next) => showNode(next),
    reload: () => load(),
  });
  const header = nodeHeader(name);
  const gpuPanel = gpusPanel({ onSelect: (uuid) => selectGpu(uuid) });
  const charts = chartsPanel({
    windowS: Number(ctx.query.get("window")),
    onWindow() {
      keepInAddress();
      if (selected) loadHistory(selected);
    },
  });
  const xidPanel = xidsPanel();
  const rankPanel = ranksPanel();
  const feedRoot = h("div");

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/" }, "Overview"), " / ", name),
    h("div", { class: "title-row" }, header.header, h("span", { class: "spacer" }), cordonPanel.cordonButton),
    header.facts,
    cordonPanel.el,
    gpuPanel.el,
    charts.el,
    // Full width each: the ranks table has nine columns, and half a page clipped the last
    // (the heartbeat) behind a scroll bar.
    rankPanel.el,
    xidPanel.el,
    section("node-events-heading", "Events on this node", null, feedRoot),
  );

  charts.start();
  let gpus = [];
  let node = null;
  let selected = ctx.query.get("gpu");
  let historyRequest = 0;
  let pending = null; // live samples that arrived while the history was loading
  let reloadedForCount = null; // GPU count that last triggered a reload of the inventory

  // --- header, cordon ---------------------------------------------------------------

  function showNode(next) {
    node = next;
    header.update(node, stragglerText);
    cordonPanel.update(node);
  }

  // --- GPUs and charts --------------------------------------------------------------

  function showGpus(list) {
    gpus = [...list].sort((a, b) => a.index - b.index);
    gpuPanel.update(gpus);
    if (!gpuPanel.has(selected)) selected = gpus[0]?.uuid ?? null;
    selectGpu(selected, { force: true });
    renderXids(); // the XID rows name GPUs by index
  }

  function selectGpu(uuid, { force = false } = {}) {
    if (!force && uuid === charts.shown()) return;
    selected = uuid;
    gpuPanel.select(uuid);
    const gpu = gpus.find((g) => g.uuid === uuid);
    charts.show(gpu, gpus.length);
    if (!gpu) return;
    keepInAddress();
    loadHistory(uuid);
  }

  // Keep the GPU and the window in the address (without a hashchange), so a reload shows
  // the same charts.
  function keepInAddress() {
    const q = new URLSearchParams({ gpu: selected ?? "" });
    if (charts.windowS() !== DEFAULT_WINDOW_S) q.set("window", String(charts.windowS()));
    const hash = `#/nodes/${encodeURIComponent(name)}?${q}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  async function loadHistory(uuid) {
    const request = ++historyRequest;
    pending = [];
    charts.loading();
    try {
      const now = Date.now() / 1000;
      const answer = await apiGet(
        `gpus/${encodeURIComponent(uuid)}/samples`,
        { since: Math.floor(now - charts.windowS()), points: HISTORY_POINTS },
        { signal: ctx.signal },
      );
      if (request !== historyRequest) return;
      charts.history(answer.columns, pending);
    } catch (error) {
      if (error.name === "AbortError" || request !== historyRequest) return;
      charts.historyFailed(error, pending);
    } finally {
      if (request === historyRequest) {
        pending = null;
        charts.loaded();
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
        header.missing();
        gpuPanel.missing();
        charts.missing();
      } else {
        gpuPanel.fail(error);
      }
      return false;
    }
  }

  // --- XID history ------------------------------------------------------------------

  let xids = [];
  let catalog = new Map();

  function renderXids() {
    xidPanel.update(xids, catalog, gpus);
  }

  async function loadXids() {
    try {
      const list = await apiGet("events", { node: name, kind: "xid", limit: MAX_XIDS }, { signal: ctx.signal });
      const known = new Set(xids.map((e) => e.id));
      xids = [...xids, ...list.filter((e) => !known.has(e.id))].sort((a, b) => b.ts - a.ts).slice(0, MAX_XIDS);
      renderXids();
    } catch (error) {
      if (error.name !== "AbortError") xidPanel.fail(error);
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
      rankPanel.update(hosted, recent.length);
    } catch (error) {
      if (error.name !== "AbortError") rankPanel.fail(error);
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
    gpuPanel.samples(samples);
    const mine = samples.filter((s) => s.uuid === selected);
    if (mine.length === 0) return;
    if (pending) pending.push(...mine);
    else charts.live(mine);
  });
  const offEvents = ctx.stream.on("event", (event) => {
    if (event.node !== name || event.kind !== "xid") return;
    if (xids.some((e) => e.id === event.id)) return;
    xids = [event, ...xids].sort((a, b) => b.ts - a.ts).slice(0, MAX_XIDS);
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
    charts.destroy();
  };
}
