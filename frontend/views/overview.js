// Overview (#/): every node as a tile coloured by health (a cordoned node carries its
// reason in its tooltip and in the table), counts by state, the nodes that need attention,
// the active and recently ended jobs with their state and goodput, open incidents (an
// exclusion held by the breaker says so), and the live event feed.
// Loaded from GET /nodes, /jobs, /jobs/<job>/goodput, /jobs/<job>/stragglers, /incidents
// and /events; kept current by the `nodes` tick (every 2 s, which also paces the re-reads
// of jobs), `event`, `incident` and `command` SSE events.
//
// This module reads and lays out; each panel (views/overview/) builds its own elements
// (`el`) and shows what it is given (`update`, `fail`).
import { apiGet, isMissingRoute } from "../api.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { h, replace } from "../lib/dom.js";
import { jobEnded, jobState } from "../lib/format.js";
import { section } from "../lib/panels.js";
import { incidentsPanel } from "./overview/incidents.js";
import { jobsPanel } from "./overview/jobs.js";
import { nodesPanel } from "./overview/nodes.js";

export const title = "Overview";

const JOBS_EVERY_S = 10; // jobs, goodput and stragglers are re-read at most this often
const RECENT_S = 3600; // jobs seen (or ended) within this long are on the overview
const MAX_JOBS = 20; // jobs whose goodput and stragglers are read

export function mount(root, ctx) {
  ctx.stream.setTopics(["nodes", "events", "incidents"]);

  const nodes = nodesPanel();
  const jobs = jobsPanel();
  const incidents = incidentsPanel();
  const feedRoot = h("div");

  replace(
    root,
    h("h1", {}, "Cluster overview"),
    nodes.summaryLine,
    h(
      "div",
      { class: "overview-grid" },
      nodes.el,
      h(
        "div",
        { class: "side-col" },
        jobs.el,
        incidents.el,
        section("events-heading", "Recent events", null, feedRoot),
      ),
    ),
  );

  // --- jobs, goodput, stragglers ----------------------------------------------------

  let jobsReadAt = 0;
  let goodputMissing = false;
  let stragglersMissing = false;

  async function loadJobs() {
    jobsReadAt = Date.now() / 1000;
    try {
      const all = await apiGet("jobs", {}, { signal: ctx.signal });
      const now = Date.now() / 1000;
      // The active jobs, and those that ended within the last hour (with when they ended).
      const running = all.filter(
        (j) => !jobEnded(j) && jobState(j, now) !== "idle" && now - j.last_seen <= RECENT_S,
      );
      const recent = all.filter(
        (j) => running.includes(j) || (jobEnded(j) && now - (j.ended_at ?? j.last_seen) <= RECENT_S),
      );
      const shown = (recent.length ? recent : all).slice(0, MAX_JOBS);
      const goodputs = new Map();
      const flagged = new Set();
      await Promise.all([
        ...shown.map(async (job) => {
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
      nodes.setStragglers(flagged);
      jobs.update({ jobs: all, running, recent, shown, goodputs, goodputMissing });
    } catch (error) {
      if (error.name !== "AbortError") jobs.fail(error);
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
      incidents.update([...pending, ...open]);
    } catch (error) {
      if (error.name !== "AbortError") incidents.fail(error);
    }
  }

  function incidentsSoon() {
    clearTimeout(incidentsTimer);
    incidentsTimer = setTimeout(loadIncidents, 300);
  }

  apiGet("nodes", {}, { signal: ctx.signal })
    .then((list) => nodes.setNodes(list, "rest"))
    .catch((error) => {
      if (error.name !== "AbortError") nodes.fail(error);
    });
  loadJobs();
  loadIncidents();

  const offNodes = ctx.stream.on("nodes", (list) => {
    nodes.setNodes(list, "live");
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
