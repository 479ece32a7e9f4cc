// Policy replay (#/replay): a candidate policy (TOML, merged over the default as a policy
// file is), a period and optionally a job; Replay sends them to POST /policy/replay
// (operator), which replays the period's recorded evidence through the real engine under
// the policy in force and under the candidate, on scratch databases (docs/replay.md).
// The answer: the two policies side by side, the self-check, the incidents where they
// differ (lib/replay.js). A refusal is shown with the server's reason: the candidate's
// key, line and reason; no evidence in the period; the limit a period passes.
//
// The form and the last report outlive the view (this tab's memory), so following an
// incident's link and coming back shows them again.
import { apiGet, apiPost, canOperate, getToken, isMissingRoute } from "../api.js";
import { h, replace } from "../lib/dom.js";
import { reportView } from "../lib/replay.js";

export const title = "Policy replay";

const EXAMPLE = `# The candidate: only the keys it changes, merged over the default policy
# (backend/policy/default.toml), as a policy file is. Keys and values are checked as
# at the server's start; shadow rules ({ action = ..., shadow = true }) are allowed.
#
# For example, a lower cap of the breaker: at most 12.5 % of the cluster's nodes
# cordoned automatically in a rolling window (the default is 25 %, at least 1 node).
[breaker]
max_fraction = 0.125
`;

const PERIODS = [
  ["3600", "the last hour"],
  ["86400", "the last 24 hours"],
  ["604800", "the last 7 days"],
  ["range", "from \u2026 to \u2026"],
];

// What the page keeps while the tab lives: the form and the last report (shown again only
// to the token that asked for it: a sign-out forgets it).
const kept = { policy: EXAMPLE, period: "86400", from: "", to: "", job: "", report: null, token: null };

/** A refusal in the page's words: what went wrong, then the server's own reason. */
function refusalText(error) {
  const detail = error.detail ?? error.message;
  if (error.status === 0) return ["The server cannot be reached", "try again once it is back."];
  if (error.status === 403) return ["Refused", `replaying needs an operator token (${detail}).`];
  if (isMissingRoute(error)) return ["Not available", "this server has no policy replay yet."];
  if (error.code === "bad_policy") return ["The candidate policy does not validate", detail];
  if (error.code === "no_evidence") return ["No evidence in this period", detail];
  if (error.code === "replay_limit") return ["The period is too large", detail];
  if (error.status === 422) return ["The server did not accept this", detail];
  return ["The replay failed", error.message];
}

/** Select line n (1-based) of a textarea and bring it into view: the line a refusal names. */
function selectLine(textarea, n) {
  const lines = textarea.value.split("\n");
  if (n < 1 || n > lines.length) return;
  const start = lines.slice(0, n - 1).reduce((sum, l) => sum + l.length + 1, 0);
  textarea.focus();
  textarea.setSelectionRange(start, start + lines[n - 1].length);
  const lineHeight = parseFloat(getComputedStyle(textarea).lineHeight) || 20;
  textarea.scrollTop = Math.max(0, (n - 3) * lineHeight);
}

export function mount(root, ctx) {
  ctx.stream.setTopics([]);
  const operator = canOperate();
  const policy = h("textarea", {
    id: "replay-policy",
    class: "mono",
    rows: 12,
    spellcheck: "false",
    autocomplete: "off",
    "aria-describedby": "replay-policy-help",
  });
  policy.value = kept.policy;
  const period = h(
    "select",
    { id: "replay-period" },
    PERIODS.map(([v, label]) => h("option", { value: v, selected: v === kept.period }, label)),
  );
  const from = h("input", { id: "replay-from", type: "datetime-local", step: 1, value: kept.from });
  const to = h("input", { id: "replay-to", type: "datetime-local", step: 1, value: kept.to });
  const range = h(
    "span",
    { class: "replay-range" },
    h("label", { for: "replay-from" }, "From"),
    from,
    h("label", { for: "replay-to" }, "to"),
    to,
    h("span", { class: "muted" }, "(empty: now)"),
  );
  const job = h("input", {
    id: "replay-job",
    type: "search",
    list: "replay-job-names",
    placeholder: "every job",
    size: 18,
    autocomplete: "off",
    value: kept.job,
  });
  const jobNames = h("datalist", { id: "replay-job-names" });
  const button = h("button", { type: "submit", class: "btn btn-primary", id: "replay-run", disabled: !operator }, "Replay");
  const busy = h("span", { class: "replay-busy muted", role: "status", "aria-live": "polite" });
  const message = h("div", { class: "replay-message" });
  const result = h("div", { class: "replay-result", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "panel replay-form", "aria-labelledby": "replay-form-heading", novalidate: true },
    h("div", { class: "panel-head" }, h("h2", { id: "replay-form-heading" }, "Candidate and period")),
    h(
      "div",
      { class: "replay-field" },
      h("label", { for: "replay-policy" }, "Candidate policy (TOML)"),
      policy,
      h(
        "p",
        { class: "field-help muted", id: "replay-policy-help" },
        "Replayed beside the policy in force; nothing live is changed and no command is sent.",
      ),
    ),
    h(
      "div",
      { class: "replay-controls" },
      h("label", { for: "replay-period" }, "Period"),
      period,
      range,
      h("label", { for: "replay-job" }, "Job"),
      job,
      jobNames,
      h("span", { class: "spacer" }),
      busy,
      button,
    ),
    operator
      ? null
      : h(
          "p",
          { class: "muted note replay-viewer" },
          "Replaying needs an operator token; this one may only read.",
        ),
    message,
  );
  replace(
    root,
    h("h1", {}, "Policy replay"),
    h(
      "p",
      { class: "muted note replay-intro" },
      "What a candidate policy would have decided over a recorded period, beside what the policy in force decides: the period\u2019s evidence goes through the real decision engine twice, on scratch databases.",
    ),
    form,
    result,
  );

  const showRange = () => {
    range.hidden = period.value !== "range";
  };
  showRange();
  const keep = () => {
    Object.assign(kept, { policy: policy.value, period: period.value, from: from.value, to: to.value, job: job.value });
  };
  for (const el of [policy, period, from, to, job]) el.addEventListener("input", keep);
  period.addEventListener("change", () => {
    showRange();
    keep();
    if (period.value === "range" && !from.value) from.focus();
  });
  // Ctrl+Enter in the policy replays, as in a query editor.
  policy.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });

  function refuse(error) {
    const [what, why] = refusalText(error);
    const line = error.code === "bad_policy" ? /\(line (\d+)\)/.exec(String(error.detail ?? ""))?.[1] : null;
    policy.setAttribute("aria-invalid", String(error.code === "bad_policy"));
    replace(
      message,
      h(
        "div",
        { class: "error replay-error", role: "alert", dataset: { code: error.code ?? String(error.status) } },
        h("strong", {}, `${what}: `),
        h("span", { class: "replay-error-detail" }, why),
      ),
    );
    if (line) selectLine(policy, Number(line));
  }

  /** The request's body from the form, or a message saying what to fill in. */
  function body() {
    const out = { policy: policy.value };
    if (period.value === "range") {
      const since = from.value ? new Date(from.value).getTime() / 1000 : NaN;
      if (!Number.isFinite(since)) return "Give the period's start (From).";
      out.since = since;
      if (to.value) {
        const until = new Date(to.value).getTime() / 1000;
        if (!(until > since)) return "The period's end must come after its start.";
        out.until = until;
      }
    } else {
      out.last_s = Number(period.value);
    }
    if (job.value.trim()) out.job = job.value.trim();
    return out;
  }

  let running = null; // the replay under way: {controller}
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (running || !operator) return;
    const request = body();
    if (typeof request === "string") {
      replace(message, h("p", { class: "error", role: "alert" }, request));
      return;
    }
    keep();
    replace(message);
    policy.removeAttribute("aria-invalid");
    const controller = new AbortController();
    const abort = () => controller.abort();
    ctx.signal.addEventListener("abort", abort);
    running = { controller };
    const started = performance.now();
    const tick = () => {
      const s = Math.floor((performance.now() - started) / 1000);
      busy.textContent = `Replaying the period under both policies\u2026${s ? ` ${s} s` : ""}`;
    };
    tick();
    const timer = setInterval(tick, 1000);
    button.disabled = true;
    button.textContent = "Replaying\u2026";
    form.setAttribute("aria-busy", "true");
    result.classList.add("stale");
    try {
      kept.report = await apiPost("policy/replay", request, { signal: controller.signal });
      kept.token = getToken();
      show();
    } catch (error) {
      if (error.name !== "AbortError") refuse(error);
    } finally {
      clearInterval(timer);
      ctx.signal.removeEventListener("abort", abort);
      running = null;
      if (!ctx.signal.aborted) {
        busy.textContent = "";
        button.disabled = false;
        button.textContent = "Replay";
        form.removeAttribute("aria-busy");
        result.classList.remove("stale");
      }
    }
  });

  function show() {
    const mine = kept.report && kept.token === getToken();
    replace(result, mine ? reportView(kept.report) : null);
  }
  show();

  // Suggestions only: any job name may be typed.
  apiGet("jobs", {}, { signal: ctx.signal }).then(
    (rows) => replace(jobNames, rows.map((r) => h("option", { value: r.name }))),
    () => {},
  );
  return () => {};
}
