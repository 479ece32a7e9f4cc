// A node's cordon on its page: who or what cordoned it (trainguard's engine or an
// operator), why, the incident and its hardware evidence, since when, whether it is
// flagged for repair, the history of its cordons (GET /nodes/<name>/cordons), and the
// operator's controls: Cordon... (for the page's title row) and Readmit..., each asking
// for an audited reason in the confirmation dialog (POST /nodes/<name>/cordon|uncordon).
//
// The server may answer an action before a read sees it: after one, the panel shows the
// change at once, and `stale(answer)` tells the page which reads still predate it.
import { apiGet, apiPost, canOperate } from "../api.js";
import { actorText, incidentLink, repairBadge } from "../lib/cordons.js";
import { emptyState, h, replace } from "../lib/dom.js";
import { statusBadge, timeEl } from "../lib/format.js";
import { factItems, failure, table } from "../lib/panels.js";
import { confirmDialog } from "./confirm-dialog.js";

const SETTLE_MS = 5000; // how long a read may still predate our own action

export class CordonPanel {
  #name;
  #signal;
  #reload;
  #show;
  #node = null;
  #rows = null; // the history, newest first (null: not read yet)
  #error = null;
  #key = null; // what the history was last read for
  #settlesAt = 0;
  #operator = canOperate(); // a viewer's page has no Cordon... or Readmit...
  #headline = h("span", { class: "cordon-headline-text" });
  #details = h("div", { class: "cordon-details" });
  #history = h("div", { class: "cordon-history" });

  /**
   * name: the node; signal: the view's; show(node): the page shows a node (and calls
   * update); reload(): re-reads the page's node and resolves to false while the answer
   * still predates the action (see stale()).
   */
  constructor({ name, signal, show, reload }) {
    this.#name = name;
    this.#signal = signal;
    this.#show = show;
    this.#reload = reload;
    // Built once: the buttons keep their elements (and keyboard focus) across updates.
    this.cordonButton = h(
      "button",
      { type: "button", class: "btn", hidden: true, dataset: { action: "cordon" } },
      "Cordon\u2026",
    );
    this.readmitButton = h(
      "button",
      { type: "button", class: "btn btn-primary", id: "readmit-node", dataset: { action: "uncordon" } },
      "Readmit\u2026",
    );
    this.el = h(
      "section",
      { class: "panel cordon-panel", id: "cordon-panel", "aria-labelledby": "cordon-heading", hidden: true },
      h("div", { class: "panel-head" }, h("h2", { id: "cordon-heading" }, "Cordon")),
      h(
        "div",
        { class: "cordon-now" },
        h("div", { class: "cordon-headline" }, this.#headline, h("span", { class: "spacer" }), this.readmitButton),
        this.#details,
      ),
      h("h3", { class: "sub-heading" }, "History of its cordons"),
      this.#history,
    );
    this.cordonButton.addEventListener("click", () => this.#act("cordon"));
    this.readmitButton.addEventListener("click", () => this.#act("uncordon"));
  }

  /** True when `answer` (a read of the node) predates the panel's own last action. */
  stale(answer) {
    return Boolean(answer && this.#node && Date.now() < this.#settlesAt && answer.cordoned !== this.#node.cordoned);
  }

  /** Show the node (GET /nodes/<name> or the `nodes` tick); reads the history when it changed. */
  update(node) {
    this.#node = node;
    this.cordonButton.hidden = !this.#operator || Boolean(node.cordoned); // a cordoned node is readmitted below
    this.#render();
    const key = `${node.cordoned}|${node.cordon?.id ?? ""}|${node.cordons_recent ?? 0}`;
    if (key !== this.#key) {
      this.#key = key;
      this.#loadHistory();
    }
  }

  #render() {
    const node = this.#node;
    if (!node) return;
    const c = node.cordon;
    this.el.hidden = !node.cordoned && !c && !this.#rows?.length && !this.#error;
    this.el.dataset.cordoned = String(Boolean(node.cordoned));
    this.el.dataset.repair = String(Boolean(node.repair));
    this.readmitButton.hidden = !this.#operator || !node.cordoned;
    if (node.cordoned) {
      replace(
        this.#headline,
        statusBadge("cordoned"),
        " ",
        c
          ? ["by ", h("strong", { dataset: { field: "cordon-by" } }, actorText(c.by)), " since ", timeEl(c.at)]
          : "no new work is placed on it",
        node.repair ? [" ", repairBadge(node)] : null,
      );
      replace(this.#details, c ? cordonFacts(node, c) : null, cordonNote(node, c));
    } else {
      const last = this.#rows?.[0];
      replace(
        this.#headline,
        "Not cordoned.",
        last?.released_at
          ? [
              " Readmitted ",
              timeEl(last.released_at),
              ` by ${actorText(last.released_by)}`,
              last.release_reason ? `: ${last.release_reason}` : null,
            ]
          : null,
      );
      replace(this.#details);
    }
    this.#renderHistory();
  }

  #renderHistory() {
    if (this.#error) {
      replace(this.#history, failure("the cordon history", this.#error, "This server keeps no cordon history."));
    } else if (this.#rows === null) {
      replace(this.#history, h("p", { class: "muted" }, "Loading the history\u2026"));
    } else if (!this.#rows.length) {
      replace(this.#history, emptyState("Never cordoned."));
    } else {
      replace(this.#history, h("div", { class: "table-scroll" }, historyTable(this.#rows)));
    }
  }

  async #loadHistory() {
    try {
      this.#rows = await apiGet(`nodes/${encodeURIComponent(this.#name)}/cordons`, {}, { signal: this.#signal });
      this.#error = null;
    } catch (error) {
      if (error.name === "AbortError") return;
      this.#error = error;
    }
    this.#render();
  }

  async #act(action) {
    const node = this.#node;
    if (!node) return;
    const readmit = action === "uncordon";
    const name = this.#name;
    const result = await confirmDialog({
      title: readmit ? `Readmit ${name}?` : `Cordon ${name}?`,
      text: readmit
        ? `The uncordon hook runs and the node takes new work again.${
            node.repair
              ? ` It is flagged for repair (${node.cordons_recent} cordons in 7 days): readmit it only once it has been repaired.`
              : ""
          }`
        : "No new work is placed on a cordoned node. A node that hosts live ranks also leaves their jobs: its launcher there is ended and their other nodes restart without it.",
      confirmLabel: readmit ? "Readmit" : "Cordon",
      danger: !readmit,
      fields: [
        { name: "reason", label: "Reason (audited)", required: true },
        {
          // Offered only when the server refuses a cordon of a node with live ranks (409,
          // code live_ranks): the operator confirms taking it out of their jobs.
          name: "force",
          label: "Take the node out of its running jobs (force)",
          kind: "checkbox",
          hidden: true,
        },
      ],
      signal: this.#signal,
      action: ({ reason, force }) =>
        apiPost(
          `nodes/${encodeURIComponent(name)}/${action}`,
          force ? { reason, force: true } : { reason },
          { signal: this.#signal },
        ),
      onRefused: (error, dialog) => {
        if (error.status === 409 && error.code === "live_ranks") dialog.reveal("force");
      },
    });
    if (!result) {
      (readmit ? this.readmitButton : this.cordonButton).focus();
      return;
    }
    // Show the change at once, then re-read until the server agrees (or the window closes).
    this.#settlesAt = Date.now() + SETTLE_MS;
    const cordoned = result.cordoned ?? !readmit;
    this.#show({
      ...node,
      cordoned,
      cordon: cordoned ? node.cordon : null,
      status: cordoned ? "cordoned" : node.status,
    });
    while (!(await this.#reload()) && Date.now() < this.#settlesAt && !this.#signal.aborted) {
      await new Promise((done) => setTimeout(done, 250));
    }
    await this.#loadHistory(); // the history as of the change, not as of the optimistic view
    (readmit ? this.cordonButton : this.readmitButton).focus();
  }
}

function cordonFacts(node, c) {
  const field = (name, value, cls = null) => h("span", { class: cls, dataset: { field: name } }, value);
  return h(
    "dl",
    { class: "cordon-facts" },
    factItems([
      ["Reason", field("cordon-reason", c.reason || "\u2014", "wrap")],
      c.incident_id !== null && c.incident_id !== undefined
        ? ["Incident", field("cordon-incident", incidentLink(c.incident_id))]
        : null,
      c.evidence ? ["Evidence", field("cordon-evidence", c.evidence, "wrap")] : null,
      ["Cordons in 7 days", field("cordons-recent", String(node.cordons_recent ?? 0))],
    ]),
  );
}

function cordonNote(node, c) {
  if (node.repair) {
    return h(
      "p",
      { class: "repair-note", role: "note" },
      h("strong", {}, "Flagged for repair: "),
      `cordoned ${node.cordons_recent} times within 7 days, so trainguard does not readmit it by itself. `,
      "Readmit it once it has been repaired.",
    );
  }
  if (c?.by === "engine") {
    return h(
      "p",
      { class: "muted note" },
      "trainguard readmits it once its GPUs report healthy for the policy's time (and the health check passes), or an operator does.",
    );
  }
  return null;
}

function historyTable(rows) {
  return table(
    "cordons-table",
    ["Cordoned", "By", "Reason", "Incident", "Evidence", "Readmitted", "By", "Why"],
    h(
      "tbody",
      {},
      rows.map((c) =>
        h(
          "tr",
          { dataset: { cordon: String(c.id), open: String(!c.released_at) } },
          h("td", {}, timeEl(c.at)),
          h("td", {}, actorText(c.by)),
          h("td", { class: "wrap" }, c.reason || "\u2014"),
          h("td", {}, incidentLink(c.incident_id) ?? "\u2014"),
          h("td", { class: "wrap" }, c.evidence || "\u2014"),
          h("td", {}, c.released_at ? timeEl(c.released_at) : h("strong", { class: "status-cordoned" }, "still cordoned")),
          h("td", {}, c.released_at ? actorText(c.released_by) : ""),
          h("td", { class: "wrap" }, c.release_reason || ""),
        ),
      ),
    ),
  );
}
