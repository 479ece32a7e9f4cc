// Overview (#/): every node as a tile coloured by health (a cordoned node carries its
// reason in its tooltip and in the table), counts by state, the nodes that need attention,
// the active and recently ended jobs with their state and goodput, open incidents (an
// exclusion held by the breaker says so), and the live event feed.
// Loaded from GET /nodes, /jobs, /jobs/<job>/goodput, /jobs/<job>/stragglers, /incidents
// and /events; kept current by the `nodes` tick (every 2 s, which also paces the re-reads
// of jobs), `event`, `incident` and `command` SSE events.
import { apiGet, isMissingRoute } from "../api.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { NodeGrid } from "../components/node-grid.js";
import { breakerHold } from "../lib/approvals.js";
import { cordonCell } from "../lib/cordons.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import {
  celsius,
  duration,
  fraction,
  jobEnded,
  jobLabel,
  jobState,
  jobStateBadge,
  localTime,
  pct,
  simulatedBadge,
  STATUS_ORDER,
  statusBadge,
  timeEl,
} from "../lib/format.js";

export const title = "Overview";

const JOBS_EVERY_S = 10; // jobs, goodput and stragglers are re-read at most this often
const RECENT_S = 3600; // jobs seen (or ended) within this long are on the overview
const MAX_JOBS = 20; // jobs whose goodput and stragglers are read
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
    this.cells.gpus.textContent = String(node.gpu_count ?? 0);
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

function jobRow(job, goodput) {
  const state = jobState(job);
  let goodputCell;
  if (goodput === undefined) goodputCell = h("span", { class: "muted" }, "\u2026");
  else if (goodput === null) goodputCell = h("span", { class: "muted", title: "no goodput route on this server" }, "n/a");
  else goodputCell = h("span", { title: `over ${duration(goodput.elapsed_s)} of job time` }, fraction(goodput.goodput));
  const label = jobLabel(job);
  return h(
    "tr",
    { dataset: { job: job.name, state, running: String(state === "running" || state === "restarting") } },
    h(
      "th",
      { scope: "row" },
      h("a", { href: `#/jobs/${encodeURIComponent(job.name)}`, title: label !== job.name ? job.name : null }, label),
    ),
    h("td", { class: "col-state" }, jobStateBadge(job, { withEnd: true })),
    h("td", { class: "num", title: `world size ${job.world_size ?? "?"}` }, `${job.attempt ?? 0} / ${job.iteration ?? 0}`),
    h("td", { class: "num" }, job.last_step ?? "\u2014"),
    h("td", { class: "num col-goodput" }, goodputCell),
    h(
      "td",
      { class: "num" },
      job.open_incidents
        ? h("a", { class: "bad", href: `#/incidents?job=${encodeURIComponent(job.name)}` }, String(job.open_incidents))
        : "0",
    ),
  );
}

const PHASES = [
  ["resumed_at", "resumed"],
  ["restarted_at", "restarted"],
  ["torn_down_at", "torn down"],
  ["delivered_at", "delivered"],
  ["decided_at", "decided"],
  ["detected_at", "detected"],
  ["fault_at", "fault"],
];

/** The furthest phase an incident has reached. */
export function reachedPhase(incident) {
  const t = incident.timeline ?? {};
  return PHASES.find(([field]) => t[field] !== null && t[field] !== undefined)?.[1] ?? "\u2014";
}

function incidentItem(incident) {
  return h(
    "li",
    { class: "incident-item", dataset: { incident: String(incident.id), status: incident.status } },
    h("a", { href: `#/incidents/${incident.id}` }, `#${incident.id}`),
    " ",
    h("strong", {}, incident.level ?? "\u2014"),
    " of ",
    incident.job ? h("a", { href: `#/jobs/${encodeURIComponent(incident.job)}` }, incident.job) : "\u2014",
    " \u00b7 ",
    h("span", { class: "muted" }, `${incident.trigger ?? ""}${incident.triggered_by ? ` by ${incident.triggered_by}` : ""}`),
    " \u00b7 ",
    timeEl(incident.created_at),
    " \u00b7 ",
    incident.status === "pending"
      ? h(
          "a",
          {
            class: "phase pending",
            href: `#/incidents/${incident.id}`,
            title: breakerHold(incident) ? incident.outcome : null,
          },
          breakerHold(incident) ? "held by the breaker" : "awaiting approval",
        )
      : h("span", { class: "phase" }, reachedPhase(incident)),
  );
}

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "events", "incidents"]);

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
  const jobsRoot = h("div", {}, h("p", { class: "muted" }, "Loading jobs\u2026"));
  const incidentsRoot = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
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
            h("label", { for: "status-filter" }, "List"),
            statusFilter,
          ),
        ),
        gridRoot,
        nodesStatus,
        h("div", { class: "table-scroll nodes-table-scroll tall-scroll" }, table),
      ),
      h(
        "div",
        { class: "side-col" },
        h(
          "section",
          { class: "panel", "aria-labelledby": "jobs-heading" },
          h("div", { class: "panel-head" }, h("h2", { id: "jobs-heading" }, "Jobs"), h("a", { href: "#/jobs" }, "all jobs")),
          jobsRoot,
        ),
        h(
          "section",
          { class: "panel", "aria-labelledby": "incidents-heading" },
          h(
            "div",
            { class: "panel-head" },
            h("h2", { id: "incidents-heading" }, "Open incidents"),
            h("a", { href: "#/incidents" }, "all incidents"),
          ),
          incidentsRoot,
        ),
        h(
          "section",
          { class: "panel", "aria-labelledby": "events-heading" },
          h("div", { class: "panel-head" }, h("h2", { id: "events-heading" }, "Recent events")),
          feedRoot,
        ),
      ),
    ),
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

  function summary(list) {
    const counts = Object.fromEntries(STATUS_ORDER.map((s) => [s, 0]));
    let gpus = 0;
    let simulated = 0;
    for (const node of list) {
      counts[node.status] = (counts[node.status] ?? 0) + 1;
      gpus += node.gpu_count ?? 0;
      if (node.simulated) simulated += 1;
    }
    return [
      h("span", { class: "count-total" }, `${list.length} ${list.length === 1 ? "node" : "nodes"}`),
      h("span", {}, `${gpus} GPUs`),
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

  // --- jobs, goodput, stragglers ----------------------------------------------------

  let jobsReadAt = 0;
  let goodputMissing = false;
  let stragglersMissing = false;

  async function loadJobs() {
    jobsReadAt = Date.now() / 1000;
    try {
      const jobs = await apiGet("jobs", {}, { signal: ctx.signal });
      const now = Date.now() / 1000;
      // The active jobs, and those that ended within the last hour (with when they ended).
      const running = jobs.filter(
        (j) => !jobEnded(j) && jobState(j, now) !== "idle" && now - j.last_seen <= RECENT_S,
      );
      const recent = jobs.filter(
        (j) => running.includes(j) || (jobEnded(j) && now - (j.ended_at ?? j.last_seen) <= RECENT_S),
      );
      const shownJobs = (recent.length ? recent : jobs).slice(0, MAX_JOBS);
      const goodputs = new Map();
      const flagged = new Set();
      await Promise.all([
        ...shownJobs.map(async (job) => {
          if (goodputMissing) return goodputs.set(job.name, null);
          try {
            goodputs.set(job.name, await apiGet(`jobs/${encodeURIComponent(job.name)}/goodput`, { window: "24h" }, { signal: ctx.signal }));
          } catch (error) {
            if (error.name === "AbortError") throw error;
            if (isMissingRoute(error)) goodputMissing = true;
            goodputs.set(job.name, null);
          }
        }),
        ...running.slice(0, MAX_JOBS).map(async (job) => {
          if (stragglersMissing) return;
          try {
            const answer = await apiGet(`jobs/${encodeURIComponent(job.name)}/stragglers`, {}, { signal: ctx.signal });
            // A node is a straggler when it is flagged as a whole or hosts a flagged rank.
            for (const n of answer?.nodes ?? []) if (n.flagged || n.flagged_ranks > 0) flagged.add(n.node);
          } catch (error) {
            if (error.name === "AbortError") throw error;
            if (isMissingRoute(error)) stragglersMissing = true;
          }
        }),
      ]);
      stragglers = flagged;
      render();
      if (jobs.length === 0) {
        replace(jobsRoot, emptyState("No job has reported yet."));
        return;
      }
      replace(
        jobsRoot,
        running.length ? null : h("p", { class: "muted" }, recent.length ? "No job is running." : "No job is running; the most recent:"),
        h(
          "div",
          { class: "table-scroll" },
          h(
            "table",
            { class: "jobs-table compact" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                h("th", { scope: "col" }, "Job"),
                h("th", { scope: "col" }, "State"),
                h("th", { scope: "col", class: "num", title: "launcher attempt / in-process iteration" }, "Att / it"),
                h("th", { scope: "col", class: "num" }, "Step"),
                h("th", { scope: "col", class: "num", title: "goodput over the last 24 h" }, "Goodput"),
                h("th", { scope: "col", class: "num", title: "open incidents" }, "Open"),
              ),
            ),
            h("tbody", {}, shownJobs.map((job) => jobRow(job, goodputs.get(job.name)))),
          ),
        ),
        goodputMissing ? h("p", { class: "muted note" }, "Goodput is not available on this server yet.") : null,
        jobs.length > shownJobs.length ? h("p", { class: "muted note" }, h("a", { href: "#/jobs" }, `${jobs.length} jobs in all`)) : null,
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(jobsRoot, errorBox("Could not load jobs", error));
    }
  }

  // --- open incidents ---------------------------------------------------------------

  let incidentsTimer = null;

  async function loadIncidents() {
    try {
      const [open, pending] = await Promise.all([
        apiGet("incidents", { status: "open", limit: 50 }, { signal: ctx.signal }),
        apiGet("incidents", { status: "pending", limit: 50 }, { signal: ctx.signal }).catch((error) => {
          if (error.name === "AbortError") throw error;
          return []; // a server without the engine knows no "pending" status
        }),
      ]);
      const active = [...pending, ...open];
      replace(
        incidentsRoot,
        active.length
          ? h("ul", { class: "incident-list" }, active.map(incidentItem))
          : emptyState("No open incidents."),
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(incidentsRoot, errorBox("Could not load incidents", error));
    }
  }

  function incidentsSoon() {
    clearTimeout(incidentsTimer);
    incidentsTimer = setTimeout(loadIncidents, 300);
  }

  apiGet("nodes", {}, { signal: ctx.signal })
    .then((list) => setNodes(list, "rest"))
    .catch((error) => {
      if (error.name !== "AbortError") replace(nodesStatus, errorBox("Could not load nodes", error));
    });
  loadJobs();
  loadIncidents();

  const offNodes = ctx.stream.on("nodes", (list) => {
    setNodes(list, "live");
    if (Date.now() / 1000 - jobsReadAt >= JOBS_EVERY_S) {
      loadJobs();
      loadIncidents();
    }
  });
  const offIncident = ctx.stream.on("incident", incidentsSoon);
  const offCommand = ctx.stream.on("command", incidentsSoon);
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (reconnected) {
      loadJobs();
      loadIncidents();
    }
  });
  const offFeed = mountEventsFeed(feedRoot, ctx, { limit: 50 });

  return () => {
    clearTimeout(incidentsTimer);
    offNodes();
    offIncident();
    offCommand();
    offState();
    offFeed();
  };
}
