// Incidents (#/incidents[?status=&job=]): pending incidents awaiting an operator (approve /
// reject): dry-run recommendations, and automatic node exclusions the breaker held, with
// why; then every incident, newest first, with the phase it has reached, its recovery time
// and lost steps. Loaded from GET /incidents; re-read on
// `incident` and `command` SSE events and every 10 s on the `nodes` tick.
import { apiGet, isMissingRoute } from "../api.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { duration, timeEl } from "../lib/format.js";
import { breakerHold, decisionButtons, pendingWhy } from "../lib/approvals.js";
import { reachedPhase, recoveredByItself, statusTag } from "../lib/incidents.js";
import { table } from "../lib/panels.js";

export const title = "Incidents";

const STATUSES = ["open", "pending", "resolved", "failed", "rejected", "stopped"];
const EVERY_S = 10;

function trigger(i) {
  return `${i.trigger ?? "\u2014"}${i.triggered_by ? ` (${i.triggered_by})` : ""}`;
}

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "events", "incidents"]);
  const job = ctx.query.get("job") || null;
  const statusSelect = h(
    "select",
    { id: "incident-status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: s === ctx.query.get("status") }, s)),
  );
  const pendingRoot = h("div");
  const engineLine = h("p", { class: "muted note engine-line" });
  const listRoot = h("div", {}, h("p", { class: "muted" }, "Loading incidents\u2026"));
  replace(
    root,
    h("h1", {}, "Incidents", job ? [" of ", h("a", { href: `#/jobs/${encodeURIComponent(job)}` }, job)] : null),
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
        h("div", { class: "filters" }, h("label", { for: "incident-status" }, "Status"), statusSelect),
      ),
      listRoot,
    ),
  );

  let readAt = 0;

  async function load() {
    readAt = Date.now() / 1000;
    try {
      const [list, pending] = await Promise.all([
        apiGet("incidents", { job, status: statusSelect.value || null, limit: 200 }, { signal: ctx.signal }),
        apiGet("incidents", { job, status: "pending", limit: 50 }, { signal: ctx.signal }).catch((error) => {
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
                    dataset: { incident: String(i.id), held: breakerHold(i) ? "breaker" : "dry_run" },
                  },
                  h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`),
                  breakerHold(i) ? " holds " : " recommends ",
                  h("strong", {}, i.level),
                  breakerHold(i)?.node ? [" of ", h("a", { href: `#/nodes/${encodeURIComponent(breakerHold(i).node)}` }, breakerHold(i).node)] : null,
                  " for ",
                  h("a", { href: `#/jobs/${encodeURIComponent(i.job)}` }, i.job),
                  i.cause ? ` (${i.cause})` : null,
                  " \u00b7 ",
                  timeEl(i.created_at),
                  " ",
                  decisionButtons(i, ctx.signal, load),
                  // Why it waits, when it is not plain dry-run (said above the list).
                  breakerHold(i)
                    ? h("p", { class: "pending-why breaker-why" }, h("strong", {}, "Held by the breaker: "), pendingWhy(i))
                    : null,
                ),
              ),
            )
          : emptyState("No recommendation is waiting."),
      );
      replace(
        listRoot,
        list.length
          ? h(
              "div",
              { class: "table-scroll" },
              table(
                "incidents-table",
                ["#", "Job", "Status", "Action", "Trigger", "Cause", "Created", "Reached", "Recovery", "Lost steps"],
                h(
                  "tbody",
                  {},
                  list.map((i) =>
                    h(
                      "tr",
                      { dataset: { incident: String(i.id), status: i.status } },
                      h("th", { scope: "row", class: "num" }, h("a", { href: `#/incidents/${i.id}` }, `#${i.id}`)),
                      h("td", {}, i.job ? h("a", { href: `#/jobs/${encodeURIComponent(i.job)}` }, i.job) : "\u2014"),
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
                    ),
                  ),
                ),
                [0, 8, 9],
              ),
            )
          : emptyState(statusSelect.value ? `No ${statusSelect.value} incidents.` : "No incidents yet."),
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

  statusSelect.addEventListener("change", () => {
    const q = new URLSearchParams();
    if (job) q.set("job", job);
    if (statusSelect.value) q.set("status", statusSelect.value);
    const hash = `#/incidents${q.size ? `?${q}` : ""}`;
    history.replaceState(null, "", hash);
    load();
  });

  let soon = null;
  const later = () => {
    clearTimeout(soon);
    soon = setTimeout(load, 300);
  };
  load();
  loadEngine();
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
