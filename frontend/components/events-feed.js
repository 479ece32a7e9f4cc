// The recent-events feed: newest first, loaded from GET /events and then prepended live
// from `event` SSE events. Used by the overview (all nodes), the node view (one node) and
// the job view (one job). XIDs carry their meaning and action from the catalog.
import { apiGet } from "../api.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { shortUuid, timeEl } from "../lib/format.js";
import { describeXid, loadXidCatalog } from "../lib/xids.js";

const BAD = new Set(["xid", "gpu_lost", "rank_exit", "exception", "hang", "heartbeat_lost"]);
const WARN = new Set(["straggler", "spool_gap", "restart", "command"]);

/**
 * A rank that ended its work: exit code 0 (or none known, said clean) and no signal; the
 * backend's rule (engine/evidence.py clean_exit). A normal end is no fault.
 */
export function cleanExit(event) {
  const data = event?.data ?? {};
  if (![null, undefined, 0, ""].includes(data.signal)) return false;
  if (![null, undefined].includes(data.exit_code) && data.exit_code !== 0) return false;
  return data.clean === true || data.exit_code === 0;
}

function severity(event) {
  if (event.kind === "rank_exit" && cleanExit(event)) return "info";
  if (BAD.has(event.kind)) return "bad";
  if (WARN.has(event.kind)) return "warn";
  return "info";
}

function exitText(event) {
  if (event.kind !== "rank_exit") return null;
  const data = event.data ?? {};
  if (![null, undefined, 0, ""].includes(data.signal)) return `signal ${data.signal}`;
  if (data.exit_code !== null && data.exit_code !== undefined) {
    return data.exit_code === 0 ? "exit 0" : `exit code ${data.exit_code}`;
  }
  return cleanExit(event) ? "clean exit" : null;
}

function newestFirst(a, b) {
  return b.ts - a.ts || (b.id ?? 0) - (a.id ?? 0);
}

const keyOf = (event) => event.id ?? `${event.node}/${event.ts}/${event.kind}`;

/** "XID 79" with the catalog's meaning and action beside it (shared with the node view). */
export function xidLabel(xid, catalog) {
  const entry = describeXid(catalog, xid);
  return [
    h("strong", { class: "xid", title: "NVIDIA XID error code" }, `XID ${xid}`),
    entry ? " " : null,
    entry
      ? h(
          "span",
          { class: "xid-meaning", dataset: { action: entry.action } },
          entry.meaning,
          " ",
          h(
            "span",
            { class: "xid-action", title: entry.action_text || entry.action },
            `\u2192 ${entry.action_text || entry.action}`,
          ),
        )
      : null,
  ];
}

/** The agent's default XID message ("Xid 79: <meaning>") says nothing the catalog did not. */
export function repeatsCatalog(message, xid, catalog) {
  const meaning = describeXid(catalog, xid)?.meaning;
  return Boolean(meaning) && (message === meaning || message === `Xid ${xid}: ${meaning}`);
}

function renderEvent(event, { showNode, showJob, catalog }) {
  const xid = event.xid ?? event.data?.xid ?? null;
  const where = [];
  if (event.gpu_uuid) {
    where.push(h("span", { class: "muted", title: event.gpu_uuid }, shortUuid(event.gpu_uuid)));
  }
  if (event.job) {
    const rank = event.rank === null || event.rank === undefined ? "" : ` rank ${event.rank}`;
    where.push(
      showJob
        ? h(
            "span",
            { class: "muted" },
            "job ",
            h("a", { href: `#/jobs/${encodeURIComponent(event.job)}` }, event.job),
            rank,
          )
        : rank
          ? h("span", { class: "muted" }, rank.trim())
          : null,
    );
  }
  return h(
    "li",
    {
      class: `event sev-${severity(event)}`,
      dataset: { eventId: String(event.id ?? ""), kind: event.kind },
    },
    timeEl(event.ts, { className: "event-time" }),
    h("span", { class: "event-kind" }, event.kind),
    showNode && event.node
      ? h("a", { class: "event-node", href: `#/nodes/${encodeURIComponent(event.node)}` }, event.node)
      : null,
    xid === null ? null : xidLabel(xid, catalog),
    where,
    exitText(event) ? h("span", { class: "event-exit" }, exitText(event)) : null,
    event.message && !repeatsCatalog(event.message, xid, catalog)
      ? h("span", { class: "event-message" }, event.message)
      : null,
  );
}

/**
 * Mount the feed into root. ctx: {stream, signal}. Options: node (only this node's
 * events), job (only this job's), limit. Returns a cleanup function.
 */
export function mountEventsFeed(root, ctx, { node = null, job = null, limit = 50 } = {}) {
  const list = h("ol", { class: "events", "aria-label": "recent events" });
  const status = h("div", { class: "events-status" });
  replace(root, status, list);
  let events = [];
  const seen = new Set();
  let loaded = false;
  let catalog = new Map();

  function add(batch) {
    for (const event of batch) {
      const key = keyOf(event);
      if (seen.has(key)) continue;
      seen.add(key);
      events.push(event);
    }
    events.sort(newestFirst);
    if (events.length > limit) {
      for (const dropped of events.slice(limit)) seen.delete(keyOf(dropped));
      events = events.slice(0, limit);
    }
    render();
  }

  function render() {
    if (loaded && events.length === 0) {
      const whose = node ? " from this node" : job ? " for this job" : "";
      replace(status, emptyState(`No events${whose} yet.`));
    } else if (loaded) {
      replace(status);
    }
    replace(
      list,
      events.map((event) => renderEvent(event, { showNode: !node, showJob: !job, catalog })),
    );
  }

  async function load() {
    try {
      const batch = await apiGet("events", { limit, node, job }, { signal: ctx.signal });
      loaded = true;
      add(batch);
    } catch (error) {
      if (error.name === "AbortError") return;
      replace(status, errorBox("Could not load events", error));
    }
  }

  replace(status, h("p", { class: "muted" }, "Loading events\u2026"));
  load();
  loadXidCatalog().then((entries) => {
    if (ctx.signal.aborted) return;
    catalog = entries;
    render();
  });
  const offEvent = ctx.stream.on("event", (event) => {
    if (node && event.node !== node) return;
    if (job && event.job !== job) return;
    loaded = true;
    add([event]);
  });
  // Events stored while the stream was down are not replayed: fetch them after a reconnect.
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (reconnected) load();
  });
  return () => {
    offEvent();
    offState();
  };
}
