// The overview's Nodes panel: every node as a tile of the grid, the counts by state (the
// summary line above the panels), and the table of the nodes the filters list; a healthy
// node that hosts a flagged rank shows as a straggler.
import { gpusLostText, NodeGrid, nodeGpusLost } from "../../components/node-grid.js";
import { cordonCell } from "../../lib/cordons.js";
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { celsius, localTime, pct, simulatedBadge, STATUS_ORDER, statusBadge, timeEl } from "../../lib/format.js";

const MAX_TABLE_ROWS = 100;

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
      cordon: h("td", { class: "col-cordon" }),
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
    const lost = nodeGpusLost(node);
    this.cells.gpus.dataset.lost = String(lost);
    replace(
      this.cells.gpus,
      String(node.gpu_count ?? 0),
      lost ? [" ", h("span", { class: "badge badge-lost", title: gpusLostText(lost) }, `${lost} lost`)] : null,
    );
    this.cells.util.textContent = pct(node.util_avg);
    this.cells.temp.textContent = celsius(node.temp_max);
    replace(this.cells.seen, timeEl(node.last_seen));
    replace(this.cells.cordon, cordonCell(node));
    this.tr.dataset.repair = String(Boolean(node.repair));
  }
}

/** The node list with "straggler" derived for healthy nodes that host a flagged rank. */
function withStragglers(nodes, stragglers) {
  return nodes.map((n) =>
    n.status === "healthy" && (n.straggler || stragglers.has(n.name)) ? { ...n, status: "straggler" } : n,
  );
}

function summary(list) {
  const counts = Object.fromEntries(STATUS_ORDER.map((s) => [s, 0]));
  let gpus = 0;
  let lost = 0;
  let simulated = 0;
  for (const node of list) {
    counts[node.status] = (counts[node.status] ?? 0) + 1;
    gpus += node.gpu_count ?? 0;
    lost += nodeGpusLost(node);
    if (node.simulated) simulated += 1;
  }
  return [
    h("span", { class: "count-total" }, `${list.length} ${list.length === 1 ? "node" : "nodes"}`),
    h("span", {}, `${gpus} GPUs`),
    // The server's count (GET /nodes `gpus_lost`): GPUs whose latest sample has no reading.
    h(
      "span",
      {
        class: lost ? "count-lost status-down" : "count-lost muted",
        dataset: { count: String(lost) },
        title: "GPUs whose latest sample has no reading at all: fell off the bus (XID 79) or lost by the driver",
      },
      `GPUs lost ${lost}`,
    ),
    STATUS_ORDER.map((status) =>
      h(
        "span",
        { class: "count", dataset: { status, count: String(counts[status]) } },
        h("span", { class: "swatch", dataset: { status }, "aria-hidden": "true" }),
        statusBadge(status),
        ` ${counts[status]}`,
      ),
    ),
    simulated ? h("span", { class: "count-simulated" }, simulatedBadge(), ` ${simulated}`) : null,
  ];
}

/**
 * The panel (el) and the summary line (summaryLine, placed by the view). setNodes(list,
 * source) shows GET /nodes or a `nodes` tick; setStragglers(names) the nodes hosting a
 * flagged rank; fail(error) a failed first read.
 */
export function nodesPanel() {
  const search = h("input", {
    type: "search",
    id: "node-filter",
    placeholder: "node name",
    autocomplete: "off",
  });
  const statusFilter = h(
    "select",
    { id: "status-filter" },
    h("option", { value: "" }, "needing attention"),
    STATUS_ORDER.map((s) => h("option", { value: s }, s)),
    h("option", { value: "*" }, "all"),
  );
  const summaryLine = h("div", { class: "summary", "aria-live": "polite" });
  const updated = h("span", { class: "updated muted" });
  const gridRoot = h("div", { class: "grid-root" });
  const tbody = h("tbody");
  const tableCaption = h("caption", {});
  const table = h(
    "table",
    { class: "nodes-table", hidden: true },
    tableCaption,
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
        h(
          "th",
          { scope: "col", class: "col-cordon", title: "who or what cordoned the node, since when, and for which incident" },
          "Cordon",
        ),
      ),
    ),
    tbody,
  );
  const nodesStatus = h("div", { class: "nodes-status" }, h("p", { class: "muted" }, "Loading nodes\u2026"));

  const el = h(
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
        h("label", { for: "status-filter" }, "List"),
        statusFilter,
      ),
    ),
    gridRoot,
    nodesStatus,
    h("div", { class: "table-scroll nodes-table-scroll tall-scroll" }, table),
  );

  const grid = new NodeGrid(gridRoot);
  const rows = new Map(); // node name -> NodeRow
  let nodes = null; // null until the first answer
  let stragglers = new Set(); // nodes hosting a flagged rank of a running job
  let firstRender = true;

  function matcher() {
    const needle = search.value.trim().toLowerCase();
    return (n) => !needle || n.name.toLowerCase().includes(needle);
  }

  function render() {
    if (nodes === null) return;
    const list = withStragglers(nodes, stragglers);
    replace(summaryLine, summary(list));
    const matches = matcher();
    grid.update(list, matches);
    if (list.length === 0) {
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
    const wanted = statusFilter.value;
    const listed = list
      .filter(
        (n) =>
          matches(n) && (wanted === "*" || (wanted === "" ? n.status !== "healthy" : n.status === wanted)),
      )
      .sort(bySeverityThenName);
    const shown = listed.slice(0, MAX_TABLE_ROWS);
    const names = new Set(list.map((n) => n.name));
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
    const what = wanted === "" ? "Nodes needing attention" : wanted === "*" ? "All nodes" : `Nodes ${wanted}`;
    tableCaption.textContent =
      listed.length > shown.length ? `${what}: first ${shown.length} of ${listed.length}` : what;
    table.hidden = trs.length === 0;
    // The cordon column only while a listed node is cordoned.
    table.dataset.cordons = String(shown.some((n) => n.cordoned || n.cordon));
    replace(
      nodesStatus,
      trs.length
        ? null
        : h("p", { class: "muted" }, wanted === "" ? "Every node is healthy." : "No node matches the filter."),
    );
    if (firstRender) {
      firstRender = false;
      // The benchmark (tests/frontend/bench_overview.py) reads this mark.
      requestAnimationFrame(() => performance.mark("trainguard:overview-nodes"));
    }
  }

  function setNodes(list, source) {
    const started = performance.now();
    if (nodes === null) performance.mark("trainguard:overview-nodes-data");
    nodes = Array.isArray(list) ? list : (list?.nodes ?? []);
    replace(updated, `updated ${localTime(Date.now() / 1000)}`);
    updated.dataset.source = source;
    render();
    // How long the last update of the grid, counts and table took (read by the benchmark).
    updated.dataset.renderMs = (performance.now() - started).toFixed(1);
  }

  search.addEventListener("input", render);
  statusFilter.addEventListener("change", render);

  return {
    el,
    summaryLine,
    setNodes,
    setStragglers(names) {
      stragglers = names;
      render();
    },
    fail(error) {
      replace(nodesStatus, errorBox("Could not load nodes", error));
    },
  };
}
