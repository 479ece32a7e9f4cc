// The node page's GPUs panel: each GPU with its latest readings and a button that charts
// it, and the error counters of its latest sample (ECC, remapped rows, PCIe replays).
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { celsius, gpuLost, lostBadge, mib, pct, shortUuid, simulatedBadge, timeEl, watts } from "../../lib/format.js";
import { section, table } from "../../lib/panels.js";

// Error counters of a sample: [field, label, bad (any non-zero value is a fault)].
const COUNTERS = [
  ["ecc_sbe_volatile", "ECC SBE", false],
  ["ecc_dbe_volatile", "ECC DBE", true],
  ["remapped_correctable", "Remapped rows (corr.)", false],
  ["remapped_uncorrectable", "Remapped rows (uncorr.)", true],
  ["remap_pending", "Remap pending", true],
  ["remap_failure", "Remap failure", true],
  ["pcie_replay", "PCIe replays", false],
];

function counterText(value) {
  if (value === null || value === undefined) return "\u2014";
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

/** One row per GPU in each table; the button keeps its element so focus survives updates. */
class GpuRow {
  constructor(gpu, onSelect) {
    this.uuid = gpu.uuid;
    this.index = gpu.index;
    this.button = h(
      "button",
      { type: "button", class: "select-gpu", "aria-pressed": "false", onclick: () => onSelect(gpu.uuid) },
      "Show chart",
    );
    this.cells = {
      util: h("td", { class: "num" }),
      temp: h("td", { class: "num" }),
      mem: h("td", { class: "num" }),
      power: h("td", { class: "num" }),
      ts: h("td", {}),
    };
    this.lostSlot = h("span", { class: "badge-slot" });
    this.tr = h(
      "tr",
      { dataset: { uuid: gpu.uuid } },
      h("th", { scope: "row", class: "num" }, String(gpu.index), this.lostSlot),
      h("td", {}, gpu.name || "\u2014", gpu.simulated ? [" ", simulatedBadge()] : null),
      h("td", { class: "mono", title: gpu.uuid }, shortUuid(gpu.uuid)),
      Object.values(this.cells),
      h("td", {}, this.button),
    );
    this.counterCells = COUNTERS.map(([field]) => h("td", { class: "num", dataset: { field } }));
    this.counterTr = h(
      "tr",
      { dataset: { uuid: gpu.uuid } },
      h("th", { scope: "row", class: "num" }, String(gpu.index)),
      this.counterCells,
    );
    this.memoryTotal = gpu.memory_total_mib ?? null;
    this.latest = null;
    this.update(gpu.latest ?? null, gpu.lost);
  }

  /** lost: the server's word (GET /nodes/<name>/gpus `lost`); a live sample says it itself. */
  update(sample, lost = gpuLost(sample)) {
    if (sample && this.latest && sample.ts < this.latest.ts) return;
    this.latest = sample;
    const s = sample ?? {};
    this.tr.dataset.lost = String(lost);
    this.tr.classList.toggle("gpu-lost", lost);
    replace(this.lostSlot, lost ? lostBadge() : null);
    this.cells.util.textContent = pct(s.util);
    this.cells.temp.textContent = celsius(s.temp_c);
    this.cells.mem.textContent = mib(s.mem_used_mib, s.mem_total_mib ?? this.memoryTotal);
    this.cells.power.textContent = watts(s.power_w);
    replace(this.cells.ts, sample ? timeEl(sample.ts) : h("span", { class: "muted" }, "no sample yet"));
    COUNTERS.forEach(([field, , bad], i) => {
      const cell = this.counterCells[i];
      cell.textContent = counterText(s[field]);
      cell.classList.toggle("counter-bad", Boolean(bad && s[field]));
      cell.classList.toggle("counter-warn", Boolean(!bad && s[field]));
    });
  }

  select(selected) {
    this.tr.classList.toggle("selected", selected);
    this.button.setAttribute("aria-pressed", String(selected));
    this.button.textContent = selected ? "Charted" : "Show chart";
  }
}

/**
 * update(gpus): GET /nodes/<name>/gpus, in index order; samples(list): live readings;
 * select(uuid) marks the charted GPU (onSelect(uuid): its button was pressed); has(uuid);
 * missing(): the node has not reported; fail(error): the read failed.
 */
export function gpusPanel({ onSelect }) {
  const status = h("div", {}, h("p", { class: "muted" }, "Loading GPUs\u2026"));
  const gpuBody = h("tbody");
  const gpuTable = table(
    "gpus-table",
    ["GPU", "Model", "UUID", "Util", "Temp", "Memory", "Power", "Last sample", "Chart"],
    gpuBody,
    [0, 3, 4, 5, 6],
  );
  gpuTable.hidden = true;
  const counterBody = h("tbody");
  const counterTable = table(
    "counters-table",
    ["GPU", ...COUNTERS.map(([, label]) => label)],
    counterBody,
    COUNTERS.map((_, i) => i),
  );
  counterTable.hidden = true;
  const el = section(
    "gpus-heading",
    "GPUs",
    null,
    status,
    h("div", { class: "table-scroll" }, gpuTable),
    h("h3", { class: "sub-heading" }, "Error counters (latest sample)"),
    h("div", { class: "table-scroll" }, counterTable),
  );
  const rows = new Map(); // uuid -> GpuRow

  return {
    el,
    update(gpus) {
      rows.clear();
      for (const gpu of gpus) rows.set(gpu.uuid, new GpuRow(gpu, onSelect));
      replace(gpuBody, [...rows.values()].map((row) => row.tr));
      replace(counterBody, [...rows.values()].map((row) => row.counterTr));
      gpuTable.hidden = gpus.length === 0;
      counterTable.hidden = gpus.length === 0;
      replace(status, gpus.length ? null : emptyState("This node has not reported any GPU yet."));
    },
    samples(list) {
      for (const sample of list) rows.get(sample.uuid)?.update(sample);
    },
    select(uuid) {
      for (const row of rows.values()) row.select(row.uuid === uuid);
    },
    has: (uuid) => rows.has(uuid),
    missing() {
      replace(status, emptyState("No GPUs known for this node."));
      counterTable.hidden = true;
    },
    fail(error) {
      replace(status, errorBox("Could not load the node", error));
    },
  };
}
