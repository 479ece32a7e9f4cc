// Incident view (#/incidents/<id>): what happened and how the recovery went: the action,
// who triggered it and why, lost steps and recovery time, the recovery timeline as a
// Gantt chart of its phases (with one row per node from the command acks), the commands
// and their acks, the engine's decisions, and the evidence (the incident's own, or the
// events of the job and its nodes around the fault). A pending incident (a dry-run
// recommendation, or a node exclusion the breaker held) says why it waits and can be
// approved or rejected here. Loaded from GET /incidents/<id> and /events; re-read when a
// `command` ack or an `incident` SSE event concerns it, and every 2 s while it is open
// (the open phase of the Gantt grows with the clock).
import { apiGet } from "../api.js";
import { renderGantt } from "../components/gantt.js";
import { xidLabel } from "../components/events-feed.js";
import { breakerHold, budgetHold, decisionButtons, nodeQuestion, pendingWhy } from "../lib/approvals.js";
import { emptyState, errorBox, h, replace } from "../lib/dom.js";
import { duration, jobStateBadge, timeEl } from "../lib/format.js";
import { statusTag } from "../lib/incidents.js";
import { factItems, table } from "../lib/panels.js";
import { loadXidCatalog } from "../lib/xids.js";

export const title = (params) => `Incident #${params.id}`;

const EVIDENCE_BEFORE_S = 120; // events this long before the fault count as evidence
const EVIDENCE_AFTER_S = 30;
const MAX_EVIDENCE_NODES = 8;

export function mount(root, ctx) {
  const id = ctx.params.id;
  ctx.stream.setTopics(["nodes", "events", "incidents"]);

  const heading = h("div", { class: "title-row" }, h("h1", {}, `Incident #${id}`));
  const facts = h("dl", { class: "facts" }, h("p", { class: "muted" }, "Loading the incident\u2026"));
  const pendingBox = h("div", { class: "pending-root" });
  const reasonLine = h("div");
  const ganttRoot = h("div", { class: "gantt-root", id: "gantt" });
  const commandsRoot = h("div");
  const decisionsRoot = h("div");
  const evidenceRoot = h("div", {}, h("p", { class: "muted" }, "Loading evidence\u2026"));

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/incidents" }, "Incidents"), ` / #${id}`),
    heading,
    pendingBox,
    facts,
    reasonLine,
    h(
      "section",
      { class: "panel", "aria-labelledby": "timeline-heading" },
      h("div", { class: "panel-head" }, h("h2", { id: "timeline-heading" }, "Recovery timeline")),
      ganttRoot,
    ),
    h(
      "div",
      { class: "two-col" },
      h(
        "section",
        { class: "panel", "aria-labelledby": "commands-heading" },
        h("div", { class: "panel-head" }, h("h2", { id: "commands-heading" }, "Commands and acks")),
        commandsRoot,
        decisionsRoot,
      ),
      h(
        "section",
        { class: "panel", "aria-labelledby": "evidence-heading" },
        h("div", { class: "panel-head" }, h("h2", { id: "evidence-heading" }, "Evidence")),
        evidenceRoot,
      ),
    ),
  );

  let incident = null;
  let catalog = new Map();
  let commandIds = new Set();
  let evidenceKey = "";

  function show(inc) {
    incident = inc;
    commandIds = new Set((inc.commands ?? []).map((c) => c.id));
    replace(
      heading,
      h("h1", {}, `Incident #${inc.id}`),
      statusTag(inc.status),
      h("span", { class: "spacer" }),
      inc.status === "pending" ? decisionButtons(inc, ctx.signal, load) : null,
    );
    const held = breakerHold(inc);
    replace(
      pendingBox,
      inc.status === "pending"
        ? h(
            "div",
            {
              class: `pending-box${held ? " breaker-box" : ""}`,
              role: "note",
              dataset: { held: nodeQuestion(inc) ? "node" : held ? "breaker" : budgetHold(inc) ? "budget" : "dry_run" },
            },
            h(
              "strong",
              {},
              nodeQuestion(inc)
                ? "About the node only: its job ended. "
                : held
                  ? "Held by the breaker. "
                  : budgetHold(inc)
                    ? "Held: the launcher's last restart. "
                    : "Awaiting an operator. ",
            ),
            pendingWhy(inc),
            held
              ? h(
                  "p",
                  { class: "muted note" },
                  `Approve to cordon ${held.node ?? "the node"} and restart the job without it; reject to leave the node in service.`,
                )
              : null,
          )
        : null,
    );
    const by = inc.triggered_by ? ` by ${inc.triggered_by}` : "";
    replace(
      facts,
      factItems([
        [
          "Job",
          inc.job
            ? h(
                "span",
                {},
                h("a", { href: `#/jobs/${encodeURIComponent(inc.job)}` }, inc.job),
                inc.job_state ? [" ", jobStateBadge({ state: inc.job_state })] : null,
              )
            : "\u2014",
        ],
        ["Action", h("strong", { dataset: { field: "level" } }, inc.level ?? "\u2014")],
        ["Trigger", h("span", { dataset: { field: "trigger" } }, `${inc.trigger ?? "\u2014"}${by}`)],
        ["Cause", inc.cause ?? "\u2014"],
        inc.node ? ["Node", h("a", { href: `#/nodes/${encodeURIComponent(inc.node)}` }, inc.node)] : null,
        inc.xid !== null && inc.xid !== undefined ? ["XID", xidLabel(inc.xid, catalog)] : null,
        ["Fault step", String(inc.fault_step ?? "\u2014")],
        ["Lost steps", h("span", { dataset: { field: "lost-steps" } }, String(inc.lost_steps ?? "\u2014"))],
        ["Recovery", h("span", { dataset: { field: "recovery" } }, duration(inc.recovery_s))],
        inc.escalations ? ["Escalations", String(inc.escalations)] : null,
        ["Created", timeEl(inc.created_at)],
      ]),
    );
    replace(
      reasonLine,
      inc.reason ? h("p", { class: "reason" }, h("strong", {}, "Reason: "), inc.reason) : null,
      inc.outcome ? h("p", { class: "reason" }, h("strong", {}, "Outcome: "), inc.outcome) : null,
    );
    renderGantt(ganttRoot, inc);
    showCommands(inc);
    showDecisions(inc);
    loadEvidence(inc);
  }

  function showCommands(inc) {
    const cmds = inc.commands ?? [];
    replace(
      commandsRoot,
      cmds.length
        ? h(
            "div",
            { class: "table-scroll" },
            table(
              "commands-table",
              ["Node", "Action", "Issued", "Acks"],
              h(
                "tbody",
                {},
                cmds.map((c) =>
                  h(
                    "tr",
                    { dataset: { command: c.id } },
                    h("td", {}, h("a", { href: `#/nodes/${encodeURIComponent(c.node)}` }, c.node)),
                    h("td", {}, c.action),
                    h("td", {}, timeEl(c.issued_at)),
                    h(
                      "td",
                      { class: "wrap" },
                      (c.acks ?? []).length
                        ? (c.acks ?? []).map((a) =>
                            h(
                              "span",
                              { class: `ack ack-${a.phase}`, title: a.detail || a.phase },
                              `${a.phase.replace("_", " ")} +${duration(a.ts - c.issued_at)}`,
                            ),
                          )
                        : h("span", { class: "muted" }, "not delivered yet"),
                    ),
                  ),
                ),
              ),
            ),
          )
        : emptyState(inc.status === "pending" ? "No command until the recommendation is approved." : "No commands."),
    );
  }

  function showDecisions(inc) {
    const decisions = inc.decisions ?? [];
    const shadow = inc.shadow ?? [];
    const hooks = inc.hooks ?? [];
    replace(
      decisionsRoot,
      decisions.length
        ? [
            h("h3", { class: "sub-heading" }, "Decisions"),
            h(
              "ol",
              { class: "decisions" },
              decisions.map((d) =>
                h(
                  "li",
                  {},
                  d.at ? timeEl(d.at) : null,
                  " ",
                  h("strong", {}, d.level ?? ""),
                  d.mode ? ` (${d.mode})` : null,
                  d.by ? ` by ${d.by}` : null,
                  d.why ? [": ", d.why] : null,
                ),
              ),
            ),
          ]
        : null,
      shadow.length
        ? [
            h("h3", { class: "sub-heading" }, "Shadow rules (recorded, not acted on)"),
            h(
              "ol",
              { class: "decisions shadow-decisions" },
              shadow.map((d) =>
                h(
                  "li",
                  {},
                  d.at ? timeEl(d.at) : null,
                  " would have done ",
                  h("strong", {}, d.action ?? ""),
                  ` instead of ${d.instead_of ?? "?"}`,
                  " (",
                  h("code", {}, d.rule ?? "rule"),
                  d.cause ? `, on ${d.cause}` : null,
                  ")",
                ),
              ),
            ),
          ]
        : null,
      hooks.length
        ? [
            h("h3", { class: "sub-heading" }, "Hooks"),
            h(
              "ul",
              { class: "decisions" },
              hooks.map((k) =>
                h(
                  "li",
                  {},
                  h("code", {}, k.hook ?? "hook"),
                  ` rc ${k.rc ?? "?"}`,
                  k.duration_s !== undefined ? ` in ${duration(k.duration_s)}` : null,
                  k.output ? h("pre", { class: "hook-output" }, String(k.output).slice(0, 2000)) : null,
                ),
              ),
            ),
          ]
        : null,
    );
  }

  // --- evidence -------------------------------------------------------------------------

  function evidenceItem(e) {
    const xid = e.xid ?? e.data?.xid ?? null;
    return h(
      "li",
      { class: "event", dataset: { kind: e.kind ?? "", eventId: String(e.event_id ?? e.id ?? "") } },
      timeEl(e.ts, { className: "event-time" }),
      h("span", { class: "event-kind" }, e.kind ?? "evidence"),
      e.node ? h("a", { class: "event-node", href: `#/nodes/${encodeURIComponent(e.node)}` }, e.node) : null,
      e.rank !== null && e.rank !== undefined ? h("span", { class: "muted" }, `rank ${e.rank}`) : null,
      xid === null ? null : xidLabel(xid, catalog),
      e.cause ? h("span", { class: "muted" }, `cause ${e.cause}`) : null,
      e.message || e.detail ? h("span", { class: "event-message" }, e.message || e.detail) : null,
    );
  }

  async function loadEvidence(inc) {
    if (Array.isArray(inc.evidence) && inc.evidence.length) {
      replace(
        evidenceRoot,
        h("p", { class: "muted note" }, "What the decision engine merged into this incident."),
        h("ol", { class: "events" }, [...inc.evidence].sort((a, b) => a.ts - b.ts).map(evidenceItem)),
      );
      return;
    }
    // No evidence of the engine's (a manual restart, or a server without the engine): the
    // events of the job and of its nodes around the fault.
    const t = inc.timeline ?? {};
    const start = (t.fault_at ?? inc.created_at) - EVIDENCE_BEFORE_S;
    const end = (t.resumed_at ?? Date.now() / 1000) + EVIDENCE_AFTER_S;
    const nodes = [...new Set((inc.commands ?? []).map((c) => c.node))].slice(0, MAX_EVIDENCE_NODES);
    const key = `${start}|${Math.floor(end / 5)}|${nodes.join(",")}`;
    if (key === evidenceKey) return;
    evidenceKey = key;
    try {
      const lists = await Promise.all([
        inc.job ? apiGet("events", { job: inc.job, since: start, until: end, limit: 200 }, { signal: ctx.signal }) : [],
        ...nodes.map((node) => apiGet("events", { node, since: start, until: end, limit: 100 }, { signal: ctx.signal })),
      ]);
      const seen = new Set();
      const events = lists
        .flat()
        .filter((e) => e.kind !== "agent_start" && !seen.has(e.id) && seen.add(e.id))
        .sort((a, b) => a.ts - b.ts);
      replace(
        evidenceRoot,
        h("p", { class: "muted note" }, `Events of the job and its nodes from ${EVIDENCE_BEFORE_S / 60} min before the fault.`),
        events.length ? h("ol", { class: "events" }, events.map(evidenceItem)) : emptyState("No events around this incident."),
      );
    } catch (error) {
      if (error.name !== "AbortError") replace(evidenceRoot, errorBox("Could not load the evidence", error));
    }
  }

  // --- load and live --------------------------------------------------------------------

  async function load() {
    try {
      show(await apiGet(`incidents/${id}`, {}, { signal: ctx.signal }));
    } catch (error) {
      if (error.name === "AbortError") return;
      if (error.status === 404) {
        replace(facts, emptyState(`There is no incident #${id}.`));
        replace(ganttRoot);
        replace(evidenceRoot);
        return;
      }
      replace(facts, errorBox("Could not load the incident", error));
    }
  }

  let soon = null;
  const later = () => {
    clearTimeout(soon);
    soon = setTimeout(load, 200);
  };
  load();
  loadXidCatalog().then((entries) => {
    if (ctx.signal.aborted) return;
    catalog = entries;
    if (incident) show(incident);
  });
  const offCommand = ctx.stream.on("command", (ack) => {
    if (commandIds.has(ack?.command_id)) later();
  });
  const offIncident = ctx.stream.on("incident", (inc) => {
    if (inc?.id === id || inc?.incident_id === id) later();
  });
  const offNodes = ctx.stream.on("nodes", () => {
    if (incident && ["open", "pending"].includes(incident.status)) load();
  });
  const offState = ctx.stream.onState((_s, { reconnected }) => reconnected && load());
  return () => {
    clearTimeout(soon);
    offCommand();
    offIncident();
    offNodes();
    offState();
  };
}
