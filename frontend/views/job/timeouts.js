// The job page's timeout warnings: the rules of the timeout hierarchy (docs/restarts.md,
// "Timeout hierarchy") that the timeouts its ranks reported break, each with what goes
// wrong and its fix in one sentence, from GET /jobs/<job> `timeout_warnings`. Hidden while
// there is none; a warning never blocks the job.
import { h, replace } from "../../lib/dom.js";

/** update(job) shows the job's timeout warnings; clear() hides them. */
export function timeoutsPanel() {
  const list = h("ul", { class: "timeout-warnings" });
  const el = h(
    "section",
    { class: "panel timeouts-panel", id: "timeout-warnings", "aria-labelledby": "timeouts-heading", hidden: true },
    h("div", { class: "panel-head" }, h("h2", { id: "timeouts-heading" }, "Timeout warnings")),
    h("p", { class: "muted note" }, "The timeouts this job's ranks reported are in an order where the wrong component acts first. Training goes on; fix them at the next launch."),
    list,
  );
  return {
    el,
    update(j) {
      const warnings = j.timeout_warnings ?? [];
      el.hidden = warnings.length === 0;
      replace(
        list,
        warnings.map((w) =>
          h(
            "li",
            { dataset: { code: w.code } },
            h("span", { class: "timeout-what" }, `${w.message[0].toUpperCase()}${w.message.slice(1)}.`),
            " ",
            h("span", { class: "timeout-fix" }, h("strong", {}, "Fix: "), w.fix),
          ),
        ),
      );
    },
    clear() {
      el.hidden = true;
      replace(list);
    },
  };
}
