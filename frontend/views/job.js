// Job view (#/jobs/<name>): the job's state (since when and why; when it ended), what it
// can carry out (its nodes: training, hot spares, excluded, --nnodes; in-process under NVRx's Wrapper or not, which launcher), its generation
// (attempt, in-process iteration), the timeout warnings (timeouts in the wrong order), step
// time per rank as a heatmap over time and the cohort's median and worst rank as a line
// chart, straggler scores and flags, the ranks, goodput with its badput breakdown over
// time, the checkpoint-interval advice, its incidents and events, and a restart control
// (operator; confirmation with a level the job supports and a reason; a 202 leads to the
// new incident, a 409 is shown in the dialog with the server's reason).
// Loaded from GET /jobs/<job>, /steps, /stragglers, /goodput, /advice, /incidents; the
// steps are read incrementally on each `nodes` tick of the live stream (every 2 s), the
// rest every 10 s and whenever an event of this job arrives.
//
// This module reads, lays out and follows the live stream; each panel (views/job/)
// builds its own elements (`el`) and shows what it is given (`update`, `fail`).
import { apiGet, canOperate } from "../api.js";
import { mountEventsFeed } from "../components/events-feed.js";
import { h, replace } from "../lib/dom.js";
import { section } from "../lib/panels.js";
import { StepMatrix } from "../lib/steps.js";
import { advicePanel } from "./job/advice.js";
import { capabilitiesPanel } from "./job/capabilities.js";
import { goodputPanel } from "./job/goodput.js";
import { jobHeader } from "./job/header.js";
import { incidentsPanel } from "./job/incidents.js";
import { ranksPanel } from "./job/ranks.js";
import { restartControl } from "./job/restart.js";
import { shapePanel } from "./job/shape.js";
import { stepsPanel } from "./job/steps.js";
import { stragglersPanel } from "./job/stragglers.js";
import { timeoutsPanel } from "./job/timeouts.js";

export const title = (params) => params.name;

const MAX_COLUMNS = 300; // steps kept in the heatmap
const OVERLAP_S = 10; // re-read this much before the newest step (batches arrive out of order)
const DETAILS_EVERY_S = 10;

export function mount(root, ctx) {
  const name = ctx.params.name;
  const enc = encodeURIComponent(name);
  ctx.stream.setTopics(["nodes", "events", "incidents", `job:${name}`]);

  let job = null;
  const header = jobHeader(name);
  const restart = restartControl({ name, signal: ctx.signal, current: () => job, reload: () => loadJob() });
  const caps = capabilitiesPanel();
  const shape = shapePanel();
  const timeouts = timeoutsPanel();
  const steps = stepsPanel();
  const stragglers = stragglersPanel();
  const ranks = ranksPanel();
  const goodput = goodputPanel({ onWindow: () => loadGoodput() });
  const advice = advicePanel();
  const incidents = incidentsPanel(name);
  const feedRoot = h("div");

  replace(
    root,
    h("nav", { class: "crumbs", "aria-label": "breadcrumb" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", name),
    h(
      "div",
      { class: "title-row" },
      header.heading,
      header.stateSlot,
      h("span", { class: "spacer" }),
      canOperate() ? [restart.note, restart.button] : null, // a viewer has no action
    ),
    header.facts,
    timeouts.el,
    shape.el,
    caps.el,
    steps.el,
    // Full width each: the ranks table's nine columns clipped the heartbeat at half a page.
    stragglers.el,
    ranks.el,
    goodput.el,
    h("div", { class: "two-col" }, advice.el, incidents.el),
    section("job-events-heading", "Events of this job", null, feedRoot),
  );

  const matrix = new StepMatrix({ maxColumns: MAX_COLUMNS });
  steps.start();
  goodput.start();
  let flagged = new Set();
  let stepsLoading = false;
  let detailsReadAt = 0;

  // --- the job ------------------------------------------------------------------------

  function showJob(j) {
    job = j;
    header.update(j);
    shape.update(j);
    caps.update(j);
    timeouts.update(j);
    restart.update(j);
    ranks.update(j.ranks ?? []);
  }

  async function loadJob() {
    try {
      showJob(await apiGet(`jobs/${enc}`, {}, { signal: ctx.signal }));
      return true;
    } catch (error) {
      if (error.name === "AbortError") return false;
      if (error.status === 404 && !/^Not Found$/.test(error.detail)) {
        header.missing();
        caps.clear();
        shape.clear();
        timeouts.clear();
        restart.disable();
        return false;
      }
      header.fail(error);
      return false;
    }
  }

  // --- steps: heatmap and line chart ------------------------------------------------

  async function loadSteps() {
    if (stepsLoading) return;
    stepsLoading = true;
    try {
      const world = Math.max(job?.world_size ?? 1, 1);
      const first = matrix.lastEnd === null;
      const params = first
        ? { limit: Math.min(100000, Math.max(5000, world * MAX_COLUMNS)) }
        : { since: Math.max(0, matrix.lastEnd - OVERLAP_S), limit: Math.min(100000, Math.max(5000, world * 60)) };
      const answer = await apiGet(`jobs/${enc}/steps`, params, { signal: ctx.signal });
      const added = matrix.add(answer.columns);
      if (first || added) steps.draw(matrix, flagged);
    } catch (error) {
      if (error.name !== "AbortError") steps.fail(error);
    } finally {
      stepsLoading = false;
    }
  }

  // --- stragglers, goodput, advice, incidents -------------------------------------------

  async function loadStragglers() {
    try {
      const answer = await apiGet(`jobs/${enc}/stragglers`, {}, { signal: ctx.signal });
      flagged = new Set((answer.ranks ?? []).filter((r) => r.flagged).map((r) => r.rank));
      stragglers.update(answer, flagged);
    } catch (error) {
      if (error.name === "AbortError") return;
      flagged = new Set();
      stragglers.fail(error);
    }
  }

  async function loadGoodput() {
    try {
      goodput.update(await apiGet(`jobs/${enc}/goodput`, { window: goodput.window() }, { signal: ctx.signal }));
    } catch (error) {
      if (error.name !== "AbortError") goodput.fail(error);
    }
  }

  async function loadAdvice() {
    try {
      advice.update(await apiGet(`jobs/${enc}/advice`, {}, { signal: ctx.signal }));
    } catch (error) {
      if (error.name !== "AbortError") advice.fail(error);
    }
  }

  async function loadIncidents() {
    try {
      incidents.update(await apiGet("incidents", { job: name, limit: 10 }, { signal: ctx.signal }));
    } catch (error) {
      if (error.name !== "AbortError") incidents.fail(error);
    }
  }

  async function loadDetails() {
    detailsReadAt = Date.now() / 1000;
    await Promise.all([loadStragglers(), loadGoodput(), loadAdvice(), loadIncidents()]);
    if (matrix.lastEnd !== null) steps.reflag(matrix, flagged);
  }

  // --- live -----------------------------------------------------------------------------

  // The steps first: on a large job the analytics answers take longer, and the server
  // serves them one process-wide, so they would hold up the heatmap.
  loadJob()
    .then((found) => (found ? loadSteps() : null))
    .finally(() => {
      if (!ctx.signal.aborted) loadDetails();
    });

  let soon = null;
  const offNodes = ctx.stream.on("nodes", () => {
    if (!job) return;
    loadSteps();
    if (Date.now() / 1000 - detailsReadAt >= DETAILS_EVERY_S) {
      loadJob();
      loadDetails();
    }
  });
  const offEvent = ctx.stream.on("event", (event) => {
    if (event.job !== name) return;
    clearTimeout(soon);
    soon = setTimeout(() => {
      loadJob();
      loadDetails();
    }, 500);
  });
  const offIncident = ctx.stream.on("incident", (incident) => {
    if (!incident?.job || incident.job === name) loadIncidents();
  });
  const offState = ctx.stream.onState((_state, { reconnected }) => {
    if (reconnected) {
      loadJob();
      loadSteps();
      loadDetails();
    }
  });
  const offFeed = mountEventsFeed(feedRoot, ctx, { job: name, limit: 30 });

  return () => {
    clearTimeout(soon);
    offNodes();
    offEvent();
    offIncident();
    offState();
    offFeed();
    steps.destroy();
    goodput.destroy();
  };
}
