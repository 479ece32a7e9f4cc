// Incidents (#/incidents[?job=&node=&status=&level=&since=&cursor=]): pending incidents
// awaiting an operator (approve / reject): dry-run recommendations, and automatic node
// exclusions the breaker held, with why; then every incident, newest first, a page at a
// time, with its node, the phase it has reached, its recovery time and lost steps. The
// filters and the page live in the hash, so a view is linkable. Loaded from GET /incidents
// (keyset pages: the cursors come in its X-Next-Cursor / X-Prev-Cursor headers); re-read on
// `incident` and `command` SSE events and every 10 s on the `nodes` tick. New incidents
// appear on the first page only: a later page holds the same rows (their status follows).
import { apiGet, apiGetPage, isMissingRoute } from "../api.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { duration, timeEl } from "../lib/format.js";
import { breakerHold, budgetHold, decisionButtons, nodeQuestion, pendingWhy } from "../lib/approvals.js";
import { reachedPhase, recoveredByItself, statusTag } from "../lib/incidents.js";
import { table } from "../lib/panels.js";

export const title = "Incidents";

const STATUSES = ["open", "pending", "resolved", "failed", "rejected", "stopped"];
const LEVELS = ["in_process", "launcher", "exclude_node", "stop_job", "reset_gpu", "ignore"];
// What the hash may carry, in this order; `since` has no control (links bring it).
const KEYS = ["job", "node", "status", "level", "since", "cursor"];
const PAGE_SIZE = 50;
const EVERY_S = 10;

function trigger(i) {
  return `${i.trigger ?? "\u2014"}${i.triggered_by ? ` (${i.triggered_by})` : ""}`;
}

/** The view's state from the hash query: every filter and the page's cursor (null: none). */
function readState(query) {
  return Object.fromEntries(KEYS.map((k) => [k, query.get(k) || null]));
}

function hashOf(state) {
  const q = new URLSearchParams();
  for (const k of KEYS) if (state[k]) q.set(k, state[k]);
  return `#/incidents${q.size ? `?${q}` : ""}`;
}

function choice(id, values, selected) {
  return h(
    "select",
    { id },
    h("option", { value: "" }, "any"),
    values.map((v) => h("option", { value: v, selected: v === selected }, v)),
  );
}

/** A name filter: free text, with the names the server knows offered in a datalist. */
function nameInput(id, value) {
  return h("input", { id, type: "search", list: `${id}-names`, value: value ?? "", placeholder: "any", size: 14, autocomplete: "off" });
}

function incidentRow(i) {
  return h(
    "tr",
    { dataset: { incident: String(i.id), status: i.status, node: i.node ?? "" } },
    h("th", { scope: "row", class: "num" }, h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`)),
    h("td", {}, i.job ? h("a", { href: `#/jobs/${encodeURIComponent(i.job)}` }, i.job) : "\u2014"),
    h("td", { class: "incident-node" }, i.node ? h("a", { href: `#/nodes/${encodeURIComponent(i.node)}` }, i.node) : "\u2014"),
    h(
      "td",
      { title: i.outcome || null },
      statusTag(i.status),
      recoveredByItself(i) ? h("span", { class: "muted by-itself" }, " by itself") : null,
    ),
    h("td", {}, i.level ?? "\u2014"),
    h("td", {}, trigger(i)),
    h("td", {}, i.cause ?? "\u2014"),
    h("td", {}, timeEl(i.created_at)),
    h("td", {}, h("span", { class: "phase" }, reachedPhase(i))),
    h("td", { class: "num" }, duration(i.recovery_s)),
    h("td", { class: "num" }, i.lost_steps ?? "\u2014"),
  );
}

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "events", "incidents"]);
  const state = readState(ctx.query);
  const controls = {
    job: nameInput("incident-job", state.job),
    node: nameInput("incident-node", state.node),
    status: choice("incident-status", STATUSES, state.status),
    level: choice("incident-level", LEVELS, state.level),
  };
  const jobNames = h("datalist", { id: "incident-job-names" });
  const nodeNames = h("datalist", { id: "incident-node-names" });
  const sinceNote = h("span", { class: "muted since-filter" });
  const newer = h("button", { type: "button", class: "page-newer", disabled: true }, "\u2190 Newer");
  const older = h("button", { type: "button", class: "page-older", disabled: true }, "Older \u2192");
  const pageNote = h("span", { class: "muted page-note", "aria-live": "polite" });
  const pendingRoot = h("div");
  const engineLine = h("p", { class: "muted note engine-line" });
  const listRoot = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
  const label = (id, text) => h("label", { for: id }, text);
  const heading = h("h1");
  replace(
    root,
    heading,
    h(
      "section",
      { class: "panel", "aria-labelledby": "pending-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "pending-heading" }, "Awaiting approval")),
      h(
        "p",
        { class: "muted note" },
        "In dry-run mode the engine only recommends; an automatic node exclusion past the breaker's cap waits too. An operator approves or rejects.",
      ),
      engineLine,
      pendingRoot,
    ),
    h(
      "section",
      { class: "panel", "aria-labelledby": "all-heading" },
      h(
        "div",
        { class: "panel-head" },
        h("h2", { id: "all-heading" }, "All incidents"),
        h(
          "div",
          { class: "filters incident-filters", role: "search", "aria-label": "Filter incidents" },
          label("incident-job", "Job"),
          controls.job,
          jobNames,
          label("incident-node", "Node"),
          controls.node,
          nodeNames,
          label("incident-status", "Status"),
          controls.status,
          label("incident-level", "Action"),
          controls.level,
          sinceNote,
        ),
      ),
      listRoot,
      h("nav", { class: "filters incident-pages", "aria-label": "Incident pages" }, pageNote, newer, older),
    ),
  );

  let readAt = 0;
  let seq = 0; // the newest list request: an older answer arriving late is dropped
  let page = { next: null, prev: null };

  function filtered() {
    return KEYS.some((k) => k !== "cursor" && state[k]);
  }

  function showState() {
    history.replaceState(null, "", hashOf(state));
    replace(sinceNote, state.since ? ["created since ", timeEl(Number(state.since))] : null);
    const job = state.job;
    replace(heading, "Incidents", job ? [" of ", h("a", { href: `#/jobs/${encodeURIComponent(job)}` }, job)] : null);
  }

  async function loadList() {
    const mine = ++seq;
    const { cursor, ...filters } = state;
    const answer = await apiGetPage("incidents", { ...filters, cursor, limit: PAGE_SIZE }, { signal: ctx.signal });
    if (mine !== seq) return;
    if (cursor && !answer.prev) {
      // Paged back to the newest end: that is the first page, which live updates fill.
      state.cursor = null;
      showState();
      await loadList();
      return;
    }
    page = answer;
    newer.disabled = !answer.prev;
    older.disabled = !answer.next;
    root.dataset.page = state.cursor ? "later" : "first";
    replace(
      pageNote,
      answer.items.length
        ? `${state.cursor ? "" : "Newest "}${answer.items.length} shown${answer.next ? ", older ones on the next page" : ""}`
        : null,
    );
    replace(
      listRoot,
      answer.items.length
        ? h(
            "div",
            { class: "table-scroll" },
            table(
              "incidents-table",
              ["#", "Job", "Node", "Status", "Action", "Trigger", "Cause", "Created", "Reached", "Recovery", "Lost steps"],
              h("tbody", {}, answer.items.map(incidentRow)),
              [0, 9, 10],
            ),
          )
        : emptyState(filtered() ? "No incidents match these filters." : state.cursor ? "No incidents on this page." : "No incidents yet."),
    );
  }

  async function load() {
    readAt = Date.now() / 1000;
    try {
      const [, pending] = await Promise.all([
        loadList(),
        apiGet("incidents", { job: state.job, status: "pending", limit: 50 }, { signal: ctx.signal }).catch((error) => {
          if (error.name === "AbortError") throw error;
          return []; // an older server knows no "pending" status
        }),
      ]);
      replace(
        pendingRoot,
        pending.length
          ? h(
              "ul",
              { class: "incident-list" },
              pending.map((i) =>
                h(
                  "li",
                  {
                    class: "incident-item pending-item",
                    dataset: {
                      incident: String(i.id),
                      held: nodeQuestion(i) ? "node" : breakerHold(i) ? "breaker" : budgetHold(i) ? "budget" : "dry_run",
                    },
                  },
                  h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`),
                  nodeQuestion(i) || breakerHold(i) || budgetHold(i) ? " holds " : " recommends ",
                  h("strong", {}, i.level),
                  (nodeQuestion(i) ?? breakerHold(i))?.node
                    ? [" of ", h("a", { href: `#/nodes/${encodeURIComponent((nodeQuestion(i) ?? breakerHold(i)).node)}` }, (nodeQuestion(i) ?? breakerHold(i)).node)]
                    : null,
                  " for ",
                  h("a", { href: `#/jobs/${encodeURIComponent(i.job)}` }, i.job),
                  i.cause ? ` (${i.cause})` : null,
                  " \u00b7 ",
                  timeEl(i.created_at),
                  " ",
                  decisionButtons(i, ctx.signal, load),
                  // Why it waits, when it is not plain dry-run (said above the list).
                  nodeQuestion(i)
                    ? h("p", { class: "pending-why node-why" }, h("strong", {}, "About the node only, its job ended: "), pendingWhy(i))
                    : breakerHold(i)
                    ? h("p", { class: "pending-why breaker-why" }, h("strong", {}, "Held by the breaker: "), pendingWhy(i))
                    : budgetHold(i)
                      ? h("p", { class: "pending-why budget-why" }, h("strong", {}, "Held for the launcher's last restart: "), pendingWhy(i))
                      : null,
                ),
              ),
            )
          : emptyState("No recommendation is waiting."),
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(listRoot, errorBox("Could not load incidents", error));
    }
  }

  async function loadEngine() {
    try {
      const e = await apiGet("engine", {}, { signal: ctx.signal });
      engineLine.dataset.enabled = String(Boolean(e.enabled));
      replace(
        engineLine,
        e.enabled
          ? [
              "Decision engine: on",
              e.policy?.mode ? ` \u00b7 mode ${e.policy.mode}` : null,
              ` \u00b7 ${e.leader ? "this replica leads" : "another replica leads"}`,
              e.last_sweep_at ? [" \u00b7 last sweep ", timeEl(e.last_sweep_at)] : null,
              e.errors ? ` \u00b7 ${e.errors} errors` : null,
            ]
          : `Decision engine: off${e.detail ? ` (${e.detail})` : ""}; incidents come from manual restarts only.`,
      );
    } catch (error) {
      if (error.name === "AbortError") return;
      replace(engineLine, isMissingRoute(error) ? "This server has no decision engine yet: incidents come from manual restarts only." : `Engine status unavailable: ${error.message}`);
    }
  }

  async function loadNames() {
    // Suggestions only: the filters work without them.
    const names = (path) => apiGet(path, {}, { signal: ctx.signal }).then((rows) => rows.map((r) => r.name), () => []);
    const [jobs, nodes] = await Promise.all([names("jobs"), names("nodes")]);
    replace(jobNames, jobs.map((n) => h("option", { value: n })));
    replace(nodeNames, nodes.map((n) => h("option", { value: n })));
  }

  for (const [key, control] of Object.entries(controls)) {
    control.addEventListener("change", () => {
      const value = control.value.trim() || null;
      if (value === state[key]) return;
      state[key] = value;
      state.cursor = null; // new filters: from the newest again
      showState();
      load();
    });
  }
  const turn = (cursor) => {
    if (!cursor) return;
    state.cursor = cursor;
    showState();
    load();
  };
  newer.addEventListener("click", () => turn(page.prev));
  older.addEventListener("click", () => turn(page.next));

  let soon = null;
  const later = () => {
    clearTimeout(soon);
    soon = setTimeout(load, 300);
  };
  showState();
  load();
  loadEngine();
  loadNames();
  const offIncident = ctx.stream.on("incident", later);
  const offCommand = ctx.stream.on("command", later);
  const offNodes = ctx.stream.on("nodes", () => {
    if (Date.now() / 1000 - readAt >= EVERY_S) load();
  });
  const offState = ctx.stream.onState((_s, { reconnected }) => reconnected && load());
  return () => {
    clearTimeout(soon);
    offIncident();
    offCommand();
    offNodes();
    offState();
  };
}
