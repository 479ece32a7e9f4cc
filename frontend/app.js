// trainguard dashboard: the shell (sign-in, live-connection indicator) and the hash
// router. A view is a module exporting `title` (a string or fn(params)) and
// `mount(root, ctx)`, which renders into root and returns its cleanup function.
// ctx: {params, query, stream, signal}; the signal aborts the view's requests on leave.
import {
  apiGet,
  canOperate,
  clearToken,
  getToken,
  LiveStream,
  loadRoles,
  onUnauthorized,
  rolesKnown,
  setToken,
} from "./api.js";
import { h, replace } from "./lib/dom.js";
import * as incidentView from "./views/incident.js";
import * as incidents from "./views/incidents.js";
import * as jobView from "./views/job.js";
import * as jobs from "./views/jobs.js";
import * as login from "./views/login.js";
import * as nodeView from "./views/node.js";
import * as overview from "./views/overview.js";
import * as replay from "./views/replay.js";

const named = (match) => ({ name: decodeURIComponent(match[1]) });

const routes = [
  { name: "overview", pattern: /^\/$/, view: overview, params: () => ({}) },
  { name: "node", pattern: /^\/nodes\/([^/]+)$/, view: nodeView, params: named },
  { name: "jobs", pattern: /^\/jobs$/, view: jobs, params: () => ({}) },
  { name: "job", pattern: /^\/jobs\/([^/]+)$/, view: jobView, params: named },
  { name: "incidents", pattern: /^\/incidents$/, view: incidents, params: () => ({}) },
  {
    name: "incident",
    pattern: /^\/incidents\/(\d+)$/,
    view: incidentView,
    params: (match) => ({ id: Number(match[1]) }),
  },
  { name: "replay", pattern: /^\/replay$/, view: replay, params: () => ({}) },
];

// The top navigation: a link is current on its own page and on the pages under it.
const NAV_SECTIONS = {
  "#/": /^\/(nodes\/.*)?$/,
  "#/jobs": /^\/jobs(\/.*)?$/,
  "#/incidents": /^\/incidents(\/.*)?$/,
};

const notFound = {
  title: "Not found",
  mount(root, ctx) {
    replace(
      root,
      h("h1", {}, "Page not found"),
      h("p", {}, `Nothing lives at #${ctx.path}. `, h("a", { href: "#/" }, "Go to the overview"), "."),
    );
    ctx.stream.setTopics([]);
    return () => {};
  },
};

const main = document.getElementById("view");
const conn = document.getElementById("conn");
const signOut = document.getElementById("sign-out");
// A refused stream may mean a revoked token: a cheap REST call finds out (a 401 there
// brings the sign-in back through onUnauthorized).
const stream = new LiveStream({
  onRefused: () => apiGet("events", { limit: 1 }).catch(() => {}),
});

const CONNECTION_TEXT = {
  idle: "offline",
  connecting: "connecting",
  live: "live",
  reconnecting: "reconnecting",
};
stream.onState((state) => {
  conn.dataset.state = state;
  conn.querySelector(".label").textContent = CONNECTION_TEXT[state] ?? state;
  conn.title = {
    idle: "no live connection",
    connecting: "opening the live stream",
    live: "receiving live updates",
    reconnecting: "the live stream dropped; retrying (the page shows the last data it had)",
  }[state];
});

let current = null; // {cleanup, controller}

function unmountCurrent() {
  if (!current) return;
  current.controller.abort();
  try {
    current.cleanup?.();
  } catch (error) {
    console.error("trainguard: view cleanup failed", error);
  }
  current = null;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const at = raw.indexOf("?");
  const path = at === -1 ? raw : raw.slice(0, at);
  const query = new URLSearchParams(at === -1 ? "" : raw.slice(at + 1));
  return { path: path.startsWith("/") ? path : `/${path}`, query };
}

function resolve(path) {
  for (const route of routes) {
    const match = route.pattern.exec(path);
    if (match) return { name: route.name, view: route.view, params: route.params(match) };
  }
  return { name: "not-found", view: notFound, params: {} };
}

function setTitle(view, params) {
  const title = typeof view.title === "function" ? view.title(params) : view.title;
  document.title = title ? `${title} \u00b7 trainguard` : "trainguard";
}

function showLogin(message) {
  unmountCurrent();
  stream.stop();
  document.body.dataset.auth = "out";
  signOut.hidden = true;
  setTitle(login, {});
  const controller = new AbortController();
  const cleanup = login.mount(main, {
    message,
    signal: controller.signal,
    onLogin(token) {
      setToken(token);
      route();
    },
  });
  current = { cleanup, controller };
}

function route() {
  if (!getToken()) {
    showLogin();
    return;
  }
  if (!rolesKnown()) {
    // The views offer the operator's actions by the token's roles: ask once per sign-in
    // (a 401 brings the sign-in back through onUnauthorized).
    loadRoles().then(route, () => {});
    return;
  }
  unmountCurrent();
  document.body.dataset.auth = "in";
  document.body.dataset.role = canOperate() ? "operator" : "viewer";
  signOut.hidden = false;
  const { path, query } = parseHash();
  const { name, view, params } = resolve(path);
  setTitle(view, params);
  for (const link of document.querySelectorAll("#nav a")) {
    const href = link.getAttribute("href");
    const current = href === `#${path}` ? "page" : NAV_SECTIONS[href]?.test(path) ? "true" : null;
    if (current) link.setAttribute("aria-current", current);
    else link.removeAttribute("aria-current");
  }
  const controller = new AbortController();
  main.dataset.view = name;
  let cleanup = null;
  try {
    cleanup = view.mount(main, { params, query, path, stream, signal: controller.signal });
  } catch (error) {
    console.error(error);
    replace(main, h("p", { class: "error", role: "alert" }, `This view failed: ${error.message}`));
  }
  current = { cleanup, controller };
}

onUnauthorized(() => {
  clearToken();
  showLogin("The server rejected the stored token; sign in again.");
});

signOut.addEventListener("click", () => {
  clearToken();
  showLogin("Signed out.");
});

window.addEventListener("hashchange", () => {
  route();
  main.focus({ preventScroll: true });
});

route();
