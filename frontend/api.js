// The backend, seen from the browser: REST calls with the bearer token, and one
// Server-Sent Events connection whose state the page shows.
//
// The token lives in sessionStorage (this tab only, gone when the tab closes). REST calls
// send it as `Authorization: Bearer <token>`; EventSource cannot send headers, so the
// stream passes it as `?access_token=`, which the backend accepts on /api/v1/stream only.

const TOKEN_KEY = "trainguard.token";

// Relative to the page, so the UI also works behind a path prefix (/trainguard/ ...).
export const API_BASE = new URL("api/v1/", document.baseURI);

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  roles = undefined;
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  roles = undefined;
}

// The stored token's roles (GET /whoami): undefined until asked, null when the server
// could not say (an older server without the route). The views offer the operator's
// actions only to an operator token; the server checks every action all the same.
let roles;

export function rolesKnown() {
  return roles !== undefined;
}

let asking = null;

/** Ask the server what the stored token may do; a 401 signs out (onUnauthorized). */
export function loadRoles() {
  asking ??= apiGet("whoami")
    .then(
      (me) => {
        roles = me.roles;
      },
      (error) => {
        roles = null; // unknown: the actions are offered and the server decides
        if (error.status === 401) throw error;
      },
    )
    .finally(() => {
      asking = null;
    });
  return asking;
}

/** True unless the token is known to lack the operator role. */
export function canOperate() {
  return roles == null || roles.includes("operator");
}

export class ApiError extends Error {
  constructor(status, detail, path, code = null) {
    super(status ? `${status} ${detail}` : detail);
    this.name = "ApiError";
    this.status = status; // 0: the server could not be reached
    this.detail = detail;
    this.path = path;
    this.code = code; // a refusal a client may act on (e.g. "restart_budget"), or null
  }
}

/**
 * True when the server has no such route at all (an older server, or a part of trainguard
 * not deployed yet), as opposed to a 404 about a missing job or incident: FastAPI answers
 * an unknown path with the bare "Not Found" (405 for a path that exists only for GET).
 * Views show an honest "not available on this server" state for these.
 */
export function isMissingRoute(error) {
  if (!(error instanceof ApiError)) return false;
  return (
    (error.status === 404 && error.detail === "Not Found") ||
    (error.status === 405 && error.detail === "Method Not Allowed")
  );
}

const unauthorizedListeners = new Set();

/** Call fn(error) whenever the backend answers 401 (token missing, wrong or revoked). */
export function onUnauthorized(fn) {
  unauthorizedListeners.add(fn);
  return () => unauthorizedListeners.delete(fn);
}

function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), API_BASE);
  for (const [key, value] of Object.entries(params ?? {})) {
    if (value !== undefined && value !== null && value !== "") {
      url.searchParams.set(key, String(value));
    }
  }
  return url;
}

/** {detail, code} of an error answer (code: the API's name for the refusal, or null). */
async function errorBody(response) {
  try {
    const body = await response.json();
    const code = typeof body?.code === "string" ? body.code : null;
    if (typeof body?.detail === "string") return { detail: body.detail, code };
    return { detail: JSON.stringify(body?.detail ?? body), code };
  } catch {
    return { detail: response.statusText || "error", code: null };
  }
}

/**
 * One JSON request to /api/v1. Throws ApiError for a non-2xx answer or an unreachable
 * server; an aborted request rethrows the AbortError (callers ignore it).
 * `token` overrides the stored one (the login form checks a token before storing it).
 */
export async function apiRequest(method, path, options = {}) {
  const response = await send(method, path, options);
  if (response.status === 204) return null;
  return response.json();
}

async function send(method, path, { params, body, signal, token } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token ?? getToken()}` };
  const init = { method, headers, signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(apiUrl(path, params), init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "the server cannot be reached", path);
  }
  if (!response.ok) {
    const { detail, code } = await errorBody(response);
    const error = new ApiError(response.status, detail, path, code);
    if (response.status === 401 && token === undefined) {
      for (const fn of unauthorizedListeners) fn(error);
    }
    throw error;
  }
  return response;
}

export const apiGet = (path, params, options = {}) =>
  apiRequest("GET", path, { ...options, params });

/**
 * One page of a keyset-paged list (GET /incidents): {items, next, prev}, where next (older
 * rows) and prev (newer ones) are the opaque cursors of the adjacent pages, null at an end.
 */
export async function apiGetPage(path, params, options = {}) {
  const response = await send("GET", path, { ...options, params });
  const headers = response.headers;
  return {
    items: await response.json(),
    next: headers.get("X-Next-Cursor"),
    prev: headers.get("X-Prev-Cursor"),
  };
}

export const apiPost = (path, body, options = {}) =>
  apiRequest("POST", path, { ...options, body });

// --- live stream -----------------------------------------------------------------------

/**
 * The one SSE connection of the page. Views say which topics they need (setTopics) and
 * which named events they handle (on); the connection is reopened when the topic set
 * changes. Named events reach only addEventListener(name), never onmessage.
 *
 * state: "idle" (no token or no topics) -> "connecting" -> "live";
 *        after a drop: "reconnecting" -> "live".
 */
export class LiveStream {
  #source = null;
  #topics = [];
  #handlers = new Map(); // event name -> Set of fn(payload, messageEvent)
  #attached = new Set(); // event names with a listener on the current #source
  #state = "idle";
  #stateListeners = new Set();
  #dropped = false; // opened or failed before: the next "live" may have missed events
  #retryTimer = null;
  #retryDelay = 1000;
  #onRefused;

  /**
   * onRefused: called when the server refused the stream (an HTTP error: EventSource
   * does not say which); the app uses it to check the token with a REST call.
   */
  constructor({ onRefused = () => {} } = {}) {
    this.#onRefused = onRefused;
  }

  get state() {
    return this.#state;
  }

  get topics() {
    return [...this.#topics];
  }

  /** fn(state, {reconnected}) now and on every change; returns an unsubscribe function. */
  onState(fn) {
    this.#stateListeners.add(fn);
    fn(this.#state, { reconnected: false });
    return () => this.#stateListeners.delete(fn);
  }

  /** fn(payload, event) for each SSE event called `name`; returns an unsubscribe function. */
  on(name, fn) {
    if (!this.#handlers.has(name)) this.#handlers.set(name, new Set());
    this.#handlers.get(name).add(fn);
    this.#attach(name);
    return () => this.#handlers.get(name)?.delete(fn);
  }

  /** Use exactly these topics; reconnects only when the set changed. */
  setTopics(topics) {
    const next = [...new Set(topics)].sort();
    if (next.join(",") === this.#topics.join(",") && this.#source) return;
    this.#topics = next;
    this.#dropped = false;
    this.#connect();
  }

  /** Reopen with the current topics (after a login, for instance). */
  restart() {
    this.#dropped = false;
    this.#connect();
  }

  stop() {
    this.#close();
    this.#setState("idle");
  }

  #close() {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
    this.#source?.close();
    this.#source = null;
    this.#attached.clear();
  }

  #connect() {
    this.#close();
    const token = getToken();
    if (!token || this.#topics.length === 0) {
      this.#setState("idle");
      return;
    }
    const url = apiUrl("stream", { topics: this.#topics.join(","), access_token: token });
    const source = new EventSource(url);
    this.#source = source;
    this.#setState(this.#dropped ? "reconnecting" : "connecting");
    source.addEventListener("open", () => {
      if (source !== this.#source) return;
      this.#retryDelay = 1000;
      const reconnected = this.#dropped;
      this.#dropped = true;
      this.#setState("live", { reconnected });
    });
    source.addEventListener("error", () => {
      if (source !== this.#source) return;
      if (source.readyState === EventSource.CLOSED) {
        // The browser gave up (an HTTP error such as 401/503): retry ourselves, backing off.
        this.#source = null;
        this.#attached.clear();
        this.#retryTimer = setTimeout(() => this.#connect(), this.#retryDelay);
        this.#retryDelay = Math.min(this.#retryDelay * 2, 15000);
        this.#onRefused();
      }
      // readyState CONNECTING: the browser retries by itself.
      this.#dropped = true;
      this.#setState("reconnecting");
    });
    for (const name of this.#handlers.keys()) this.#attach(name);
  }

  #attach(name) {
    if (!this.#source || this.#attached.has(name)) return;
    this.#attached.add(name);
    this.#source.addEventListener(name, (event) => this.#dispatch(name, event));
  }

  #dispatch(name, event) {
    let payload;
    try {
      payload = JSON.parse(event.data);
    } catch {
      console.warn(`trainguard: SSE event ${name} is not JSON`, event.data);
      return;
    }
    for (const fn of this.#handlers.get(name) ?? []) {
      try {
        fn(payload, event);
      } catch (error) {
        console.error(`trainguard: handler for SSE event ${name} failed`, error);
      }
    }
  }

  #setState(state, { reconnected = false } = {}) {
    if (state === this.#state && !reconnected) return;
    this.#state = state;
    for (const fn of this.#stateListeners) fn(state, { reconnected });
  }
}
