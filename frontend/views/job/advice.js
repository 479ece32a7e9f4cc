// The job page's "Checkpoint interval" panel: the interval Daly's formula recommends (and
// Young's first-order estimate) with the expected efficiency, or what the advice still
// needs, and the measurements behind it (MTBF, failures, checkpoint cost, restore and
// restart times).
import { h, replace } from "../../lib/dom.js";
import { duration, fraction } from "../../lib/format.js";
import { factItems, failure, section } from "../../lib/panels.js";

function headline(advice) {
  const rec = advice.recommendation ?? {};
  const ckpt = advice.checkpoint ?? {};
  if (rec.daly_interval_s) {
    return h(
      "p",
      { class: "advice-text", dataset: { interval: String(rec.daly_interval_s) } },
      "Checkpoint every ",
      h("strong", {}, duration(rec.daly_interval_s)),
      ` (Daly; Young's first-order estimate: ${duration(rec.young_interval_s)}).`,
      rec.expected_efficiency_recommended !== null && rec.expected_efficiency_recommended !== undefined
        ? ` Expected efficiency ${fraction(rec.expected_efficiency_recommended)}`
        : null,
      rec.expected_efficiency_current !== null && rec.expected_efficiency_current !== undefined
        ? ` against ${fraction(rec.expected_efficiency_current)} at the current ${duration(rec.current_interval_s)}.`
        : ".",
    );
  }
  const needs = !ckpt.cost_s
    ? "a measured checkpoint cost (no checkpoint save has been reported)"
    : "a mean time between failures";
  return h("p", { class: "advice-text muted" }, `No recommendation yet: it needs ${needs}.`);
}

/** update(advice): GET /jobs/<job>/advice; fail(error). */
export function advicePanel() {
  const root = h("div", {}, h("p", { class: "muted" }, "Loading advice\u2026"));
  const el = section("advice-heading", "Checkpoint interval", null, root);

  function update(advice) {
    const rec = advice.recommendation ?? {};
    const ckpt = advice.checkpoint ?? {};
    const restart = advice.restart ?? {};
    const mtbfText =
      advice.mtbf_s !== null && advice.mtbf_s !== undefined
        ? `${duration(advice.mtbf_s)} (measured)`
        : `> ${duration(advice.mtbf_lower_bound_s)} observed; ${duration(advice.assumed_mtbf_s)} assumed for ${advice.gpus ?? "?"} GPUs`;
    replace(
      root,
      headline(advice),
      h(
        "dl",
        { class: "facts" },
        factItems([
          ["MTBF", mtbfText],
          ["Failures", `${advice.failures ?? 0} in ${duration(advice.observed_s)}`],
          ["Checkpoint cost", ckpt.cost_s ? `${duration(ckpt.cost_s)} (${ckpt.saves} saves)` : "not measured"],
          ["Current interval", duration(ckpt.interval_s ?? rec.current_interval_s)],
          ["Restore", duration(ckpt.restore_s)],
          ["Restart (median)", restart.median_s ? `${duration(restart.median_s)} over ${restart.samples}` : "\u2014"],
        ]),
      ),
    );
  }

  return {
    el,
    update,
    fail(error) {
      replace(root, failure("the advice", error, "Checkpoint-interval advice is not available on this server yet."));
    },
  };
}
