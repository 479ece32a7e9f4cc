// Overview (#/): every node with its health, and the recent events of the cluster.
// Loaded from GET /nodes and GET /events, then kept current by the `nodes` and `event`
// SSE events.
import { apiGet } from "../api.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import {
  celsius,
  localTime,
  pct,
  simulatedBadge,
  STATUS_ORDER,
  statusBadge,
  timeEl,
} from "../lib/format.js";

export const title = "Overview";

function bySeverityThenName(a, b) {
  const rank = (node) => {
    const i = STATUS_ORDER.indexOf(node.status);
    return i === -1 ? STATUS_ORDER.length : i;
  };
  return rank(a) - rank(b) || a.name.localeCompare(b.name, undefined, { numeric: true });
}

/** One table row per node; the link stays the same element so keyboard focus survives updates. */
class NodeRow {
  constructor(name) {
    this.link = h("a", { href: `#/nodes/${encodeURIComponent(name)}` }, name);
    this.badge = h("span", { class: "badge-slot" });
    this.cells = {
      status: h("td", { class: "col-status" }),
      gpus: h("td", { class: "num col-gpus" }),
      util: h("td", { class: "num col-util" }),
      temp: h("td", { class: "num col-temp" }),
      seen: h("td", { class: "col-seen" }),
    };
    this.tr = h(
      "tr",
      { dataset: { node: name } },
      h("th", { scope: "row", class: "col-name" }, this.link, this.badge),
      Object.values(this.cells),
    );
  }

  update(node) {
    this.tr.dataset.status = node.status ?? "unknown";
    this.tr.dataset.simulated = String(Boolean(node.simulated));
    replace(this.badge, node.simulated ? simulatedBadge() : null);
    replace(this.cells.status, statusBadge(node.status));
    this.cells.gpus.textContent = String(node.gpu_count ?? 0);
    this.cells.util.textContent = pct(node.util_avg);
    this.cells.temp.textContent = celsius(node.temp_max);
    replace(this.cells.seen, timeEl(node.last_seen));
  }
}

function summary(nodes) {
  const counts = Object.fromEntries(STATUS_ORDER.map((s) => [s, 0]));
  let gpus = 0;
  for (const node of nodes) {
    counts[node.status] = (counts[node.status] ?? 0) + 1;
    gpus += node.gpu_count ?? 0;
  }
  const parts = [h("span", {}, `${nodes.length} ${nodes.length === 1 ? "node" : "nodes"}`)];
  parts.push(h("span", {}, `${gpus} GPUs`));
  for (const status of STATUS_ORDER) {
    if (counts[status]) parts.push(h("span", {}, statusBadge(status), ` ${counts[status]}`));
  }
  return parts;
}

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "events"]);

  const search = h("input", {
    type: "search",
    id: "node-filter",
    placeholder: "node name",
    autocomplete: "off",
  });
  const statusFilter = h(
    "select",
    { id: "status-filter" },
    h("option", { value: "" }, "all"),
    STATUS_ORDER.map((s) => h("option", { value: s }, s)),
  );
  const summaryLine = h("p", { class: "summary", "aria-live": "polite" });
  const updated = h("span", { class: "updated muted" });
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "nodes-table", hidden: true },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", { scope: "col" }, "Node"),
        h("th", { scope: "col" }, "Health"),
        h("th", { scope: "col", class: "num" }, "GPUs"),
        h("th", { scope: "col", class: "num" }, "Avg util"),
        h("th", { scope: "col", class: "num" }, "Max temp"),
        h("th", { scope: "col" }, "Last seen"),
      ),
    ),
    tbody,
  );
  const nodesStatus = h("div", { class: "nodes-status" }, h("p", { class: "muted" }, "Loading nodes\u2026"));
  const feedRoot = h("div");

  replace(
    root,
    h("h1", {}, "Cluster overview"),
    summaryLine,
    h(
      "div",
      { class: "overview-grid" },
      h(
        "section",
        { class: "panel", "aria-labelledby": "nodes-heading" },
        h(
          "div",
          { class: "panel-head" },
          h("h2", { id: "nodes-heading" }, "Nodes"),
          updated,
          h(
            "div",
            { class: "filters" },
            h("label", { for: "node-filter" }, "Filter"),
            search,
            h("label", { for: "status-filter" }, "Health"),
            statusFilter,
          ),
        ),
        nodesStatus,
        h("div", { class: "table-scroll" }, table),
      ),
      h(
        "section",
        { class: "panel", "aria-labelledby": "events-heading" },
        h("div", { class: "panel-head" }, h("h2", { id: "events-heading" }, "Recent events")),
        feedRoot,
      ),
    ),
  );

  const rows = new Map(); // node name -> NodeRow
  let nodes = null; // null until the first answer

  function render() {
    if (nodes === null) return;
    replace(summaryLine, summary(nodes));
    if (nodes.length === 0) {
      table.hidden = true;
      replace(
        nodesStatus,
        emptyState("No nodes have reported yet."),
        h(
          "p",
          { class: "muted" },
          "Start an agent on a node: ",
          h("code", {}, "trainguard agent --server <this URL> --token <agent token>"),
        ),
      );
      return;
    }
    const needle = search.value.trim().toLowerCase();
    const wanted = statusFilter.value;
    const shown = nodes
      .filter((n) => (!needle || n.name.toLowerCase().includes(needle)) && (!wanted || n.status === wanted))
      .sort(bySeverityThenName);
    const names = new Set(nodes.map((n) => n.name));
    for (const name of rows.keys()) if (!names.has(name)) rows.delete(name);
    const trs = shown.map((node) => {
      let row = rows.get(node.name);
      if (!row) rows.set(node.name, (row = new NodeRow(node.name)));
      row.update(node);
      return row.tr;
    });
    // Re-order only when the order changed, so focus and hover are not disturbed.
    const current = [...tbody.children];
    if (current.length !== trs.length || current.some((tr, i) => tr !== trs[i])) {
      tbody.replaceChildren(...trs);
    }
    table.hidden = trs.length === 0;
    replace(nodesStatus, trs.length === 0 ? emptyState("No node matches the filter.") : null);
  }

  function setNodes(list, source) {
    nodes = Array.isArray(list) ? list : (list?.nodes ?? []);
    replace(updated, `updated ${localTime(Date.now() / 1000)}`);
    updated.dataset.source = source;
    render();
  }

  search.addEventListener("input", render);
  statusFilter.addEventListener("change", render);

  apiGet("nodes", {}, { signal: ctx.signal })
    .then((list) => setNodes(list, "rest"))
    .catch((error) => {
      if (error.name !== "AbortError") replace(nodesStatus, errorBox("Could not load nodes", error));
    });
  const offNodes = ctx.stream.on("nodes", (list) => setNodes(list, "live"));
  const offFeed = mountEventsFeed(feedRoot, ctx, { limit: 50 });

  return () => {
    offNodes();
    offFeed();
  };
}
