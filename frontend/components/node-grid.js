// Every node of the cluster as a small tile, coloured (and patterned) by health, in a grid
// that stays readable from a handful of nodes to 2,048 and more: tiles shrink with the
// node count, keep their place (sorted by name) and are dimmed, not removed, by a filter.
// A tile is a link to its node. The grid is one tab stop: arrow keys, Home and End move
// between tiles (a roving tabindex), Enter opens the node; a readout line says what the
// focused or hovered tile is.
import { cordonText } from "../lib/cordons.js";
import { h, replace } from "../lib/dom.js";
import { celsius, localTime, pct } from "../lib/format.js";

const byName = (a, b) => a.name.localeCompare(b.name, undefined, { numeric: true });

function density(count) {
  if (count <= 48) return "large";
  if (count <= 512) return "medium";
  return "small";
}

/**
 * How many of the node's GPUs are lost: the server's count (`gpus_lost`, GPUs whose
 * latest sample has no reading at all: fell off the bus, XID 79, or lost by the driver),
 * so one lost GPU of several shows too, though the node's averages still read.
 */
export function nodeGpusLost(node) {
  return node.gpus_lost ?? 0;
}

/** "1 GPU lost", "3 GPUs lost". */
export function gpusLostText(count) {
  return `${count} ${count === 1 ? "GPU" : "GPUs"} lost`;
}

function describe(node) {
  // Why a cordoned node is out of new work (who, since when, the incident, its evidence)
  // stands in for its bare status.
  const cordon = cordonText(node);
  const parts = [node.name, cordon || node.status];
  const lost = nodeGpusLost(node);
  if (lost) parts.push(`${lost} of ${node.gpu_count ?? 0} GPUs lost: every reading missing`);
  if (node.simulated) parts.push("simulated");
  parts.push(`util ${pct(node.util_avg)}`, `max ${celsius(node.temp_max)}`);
  if (node.last_seen) parts.push(`seen ${localTime(node.last_seen)}`);
  return parts.join(" \u00b7 ");
}

export class NodeGrid {
  #grid;
  #readout;
  #tiles = new Map(); // name -> {el, label, key}
  #order = []; // tiles in grid order
  #focusName = null; // the tile holding the tab stop

  /** root: an empty element. */
  constructor(root) {
    this.#grid = h("div", {
      class: "node-grid",
      role: "group",
      "aria-label": "nodes by health; arrow keys move between nodes, Enter opens one",
    });
    this.#readout = h("p", { class: "grid-readout muted", "aria-live": "polite" }, "\u00a0");
    replace(root, this.#grid, this.#readout);
    this.#grid.addEventListener("keydown", (event) => this.#onKey(event));
    this.#grid.addEventListener("focusin", (event) => this.#show(event.target));
    this.#grid.addEventListener("mouseover", (event) => this.#show(event.target));
  }

  /**
   * nodes: [{name, status (with "straggler" derived), simulated, ...}];
   * matches(node) -> bool decides which tiles are shown at full strength.
   */
  update(nodes, matches = () => true) {
    const sorted = [...nodes].sort(byName);
    const names = new Set(sorted.map((n) => n.name));
    let changedSet = sorted.length !== this.#order.length;
    for (const name of [...this.#tiles.keys()]) {
      if (!names.has(name)) {
        this.#tiles.delete(name);
        changedSet = true;
      }
    }
    const order = [];
    for (const node of sorted) {
      let tile = this.#tiles.get(node.name);
      if (!tile) {
        const el = h("a", {
          class: "tile",
          href: `#/nodes/${encodeURIComponent(node.name)}`,
          tabindex: "-1",
          dataset: { node: node.name },
        });
        tile = {
          el,
          label: h("span", { class: "tile-label" }),
          mark: h("span", { class: "tile-mark", "aria-hidden": "true" }),
          key: "",
        };
        el.append(tile.label, tile.mark);
        this.#tiles.set(node.name, tile);
        changedSet = true;
      }
      const status = node.status ?? "unknown";
      const dim = !matches(node);
      const text = describe(node);
      const cordoned = Boolean(node.cordoned || node.status === "cordoned");
      const lost = nodeGpusLost(node);
      const key = `${status}|${node.simulated}|${dim}|${node.repair}|${cordoned}|${lost}|${text}`;
      if (key !== tile.key) {
        tile.key = key;
        const el = tile.el;
        el.dataset.status = status;
        el.dataset.simulated = String(Boolean(node.simulated));
        el.dataset.cordoned = String(cordoned);
        el.dataset.repair = String(Boolean(node.repair));
        el.dataset.lost = String(lost > 0);
        el.dataset.gpusLost = String(lost);
        el.classList.toggle("dim", dim);
        el.title = text;
        el.setAttribute("aria-label", text);
        tile.label.textContent = node.name;
        // A word on the large tiles (the frame and the pattern say it on the small ones).
        tile.mark.textContent = node.repair ? "repair" : cordoned ? "cordoned" : lost ? gpusLostText(lost) : "";
        tile.node = node;
      }
      tile.node = node;
      order.push(tile);
    }
    if (changedSet || order.some((t, i) => t !== this.#order[i])) {
      this.#order = order;
      this.#grid.dataset.density = density(order.length);
      this.#grid.replaceChildren(...order.map((t) => t.el));
    }
    this.#grid.dataset.count = String(order.length);
    // Exactly one tile is in the tab order.
    if (!this.#focusName || !this.#tiles.has(this.#focusName)) {
      this.#setFocusable(order[0]?.node.name ?? null);
    }
  }

  #setFocusable(name) {
    if (this.#focusName && this.#tiles.has(this.#focusName)) {
      this.#tiles.get(this.#focusName).el.tabIndex = -1;
    }
    this.#focusName = name;
    if (name) this.#tiles.get(name).el.tabIndex = 0;
  }

  #show(target) {
    const el = target?.closest?.(".tile");
    if (!el) return;
    const tile = this.#tiles.get(el.dataset.node);
    if (tile) this.#readout.textContent = describe(tile.node);
  }

  #columns() {
    const els = this.#order.map((t) => t.el);
    if (els.length < 2) return 1;
    const top = els[0].offsetTop;
    let n = 1;
    while (n < els.length && els[n].offsetTop === top) n++;
    return n;
  }

  #onKey(event) {
    const el = event.target.closest?.(".tile");
    if (!el) return;
    const i = this.#order.findIndex((t) => t.el === el);
    if (i === -1) return;
    const cols = this.#columns();
    const last = this.#order.length - 1;
    const next = {
      ArrowRight: Math.min(i + 1, last),
      ArrowLeft: Math.max(i - 1, 0),
      ArrowDown: Math.min(i + cols, last),
      ArrowUp: Math.max(i - cols, 0),
      Home: 0,
      End: last,
    }[event.key];
    if (next === undefined) return;
    event.preventDefault();
    const tile = this.#order[next];
    this.#setFocusable(tile.node.name);
    tile.el.focus();
  }
}
