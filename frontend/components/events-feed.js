// The recent-events feed: newest first, loaded from GET /events and then prepended live
// from `event` SSE events. Used by the overview (all nodes), the node view (one node) and
// the job view (one job). XIDs carry their meaning and action from the catalog; a kind
// filter hides the checkpoint rows unless asked for.
import { apiGet } from "../api.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { shortUuid, timeEl } from "../lib/format.js";
import { describeXid, loadXidCatalog } from "../lib/xids.js";

const BAD = new Set(["xid", "gpu_lost", "rank_exit", "exception", "hang", "heartbeat_lost"]);
const WARN = new Set(["straggler", "spool_gap", "restart", "command", "timeouts"]);

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

/**
 * The XID code of an xid event, else null. Only the driver's (or an injection's) xid event
 * is an XID: a log line that mentions one (the fault injector's "injecting fault 3: xid
 * XID 79", whose data carries every field of the fault) stays a log line.
 */
export function eventXid(event) {
  if (event?.kind !== "xid") return null;
  return event.xid ?? event.data?.xid ?? null;
}

// The feed's kind filter: checkpoint phases come every few minutes from every rank and
// bury the faults, so they are hidden unless asked for.
const PROBLEM = (event) => severity(event) !== "info";
export const FEED_FILTERS = [
  ["no-checkpoints", "all but checkpoints", (event) => event.kind !== "checkpoint"],
  ["problems", "faults and warnings only", PROBLEM],
  ["checkpoints", "checkpoints only", (event) => event.kind === "checkpoint"],
  ["all", "all kinds", () => true],
];
const FILTER_KEY = "trainguard.events.filter";

function savedFilter() {
  try {
    const saved = sessionStorage.getItem(FILTER_KEY);
    return FEED_FILTERS.some(([value]) => value === saved) ? saved : FEED_FILTERS[0][0];
  } catch {
    return FEED_FILTERS[0][0];
  }
}

function renderEvent(event, { showNode, showJob, catalog }) {
  const xid = eventXid(event);
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
 * events), job (only this job's), limit (rows shown). A kind filter above the list hides
 * checkpoint rows by default; the feed keeps more events than it shows so that a filter
 * still has rows to show. Returns a cleanup function.
 */
export function mountEventsFeed(root, ctx, { node = null, job = null, limit = 50 } = {}) {
  const keep = Math.min(limit * 5, 1000); // the route's most
  const list = h("ol", { class: "events", "aria-label": "recent events" });
  const status = h("div", { class: "events-status" });
  const filter = h(
    "select",
    { class: "events-filter", "aria-label": "event kinds to show" },
    FEED_FILTERS.map(([value, label]) => h("option", { value }, label)),
  );
  filter.value = savedFilter();
  const hiddenNote = h("span", { class: "events-hidden muted", "aria-live": "polite" });
  const toolbar = h("div", { class: "events-toolbar" }, h("label", {}, "Show ", filter), hiddenNote);
  replace(root, toolbar, status, list);
  let events = [];
  const seen = new Set();
  let loaded = false;
  let catalog = new Map();

  filter.addEventListener("change", () => {
    try {
      sessionStorage.setItem(FILTER_KEY, filter.value);
    } catch {
      // storage refused (private mode): the choice lasts for this page
    }
    render();
  });

  function add(batch) {
    for (const event of batch) {
      const key = keyOf(event);
      if (seen.has(key)) continue;
      seen.add(key);
      events.push(event);
    }
    events.sort(newestFirst);
    if (events.length > keep) {
      for (const dropped of events.slice(keep)) seen.delete(keyOf(dropped));
      events = events.slice(0, keep);
    }
    render();
  }

  function render() {
    const [, label, test] = FEED_FILTERS.find(([value]) => value === filter.value) ?? FEED_FILTERS[0];
    const passing = events.filter(test);
    const shown = passing.slice(0, limit);
    const hidden = events.length - passing.length;
    root.dataset.filter = filter.value;
    root.dataset.hidden = String(hidden);
    hiddenNote.textContent = hidden ? `${hidden} of the last ${events.length} events hidden` : "";
    if (loaded && events.length === 0) {
      const whose = node ? " from this node" : job ? " for this job" : "";
      replace(status, emptyState(`No events${whose} yet.`));
    } else if (loaded && shown.length === 0) {
      replace(status, emptyState(`Nothing to show (${label}) among the last ${events.length} events.`));
    } else if (loaded) {
      replace(status);
    }
    replace(
      list,
      shown.map((event) => renderEvent(event, { showNode: !node, showJob: !job, catalog })),
    );
  }

  async function load() {
    try {
      const batch = await apiGet("events", { limit: keep, node, job }, { signal: ctx.signal });
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
