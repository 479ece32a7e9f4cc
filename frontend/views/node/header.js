// The node page's title (the node's name with its simulated and repair badges) and its
// facts: health, GPUs, utilisation, temperature, when it was last seen, its clock offset,
// its last XID and what the stragglers route says about it.
import { repairBadge } from "../../lib/cordons.js";
import { emptyState, h, replace } from "../../lib/dom.js";
import { gpusLostText } from "../../components/node-grid.js";
import { celsius, lostBadge, pct, seconds, simulatedBadge, statusBadge, timeEl } from "../../lib/format.js";
import { factItems } from "../../lib/panels.js";

function facts(node) {
  return factItems([
    ["Health", statusBadge(node.status)],
    [
      "GPUs",
      // The server's count of GPUs whose latest sample has no reading (`gpus_lost`).
      h(
        "span",
        { dataset: { field: "gpus", lost: String(node.gpus_lost ?? 0) } },
        String(node.gpu_count ?? 0),
        node.gpus_lost ? [` (${node.gpus_lost} `, lostBadge(gpusLostText(node.gpus_lost)), ")"] : null,
      ),
    ],
    ["Avg util", pct(node.util_avg)],
    ["Max temp", celsius(node.temp_max)],
    ["Last seen", timeEl(node.last_seen)],
    ["Clock offset", seconds(node.clock_offset_s)],
    node.last_xid_at ? ["Last XID", timeEl(node.last_xid_at)] : null,
  ]);
}

/**
 * header (for the title row) and facts (the list under it); update(node, stragglerText)
 * shows GET /nodes/<name> or its `nodes` tick; missing() says the node has not reported.
 */
export function nodeHeader(name) {
  const header = h("div", { class: "node-header" }, h("h1", {}, name));
  const list = h("dl", { class: "facts" });
  return {
    header,
    facts: list,
    update(node, stragglerText) {
      replace(
        header,
        h("h1", {}, name),
        node.simulated ? simulatedBadge() : null,
        node.repair ? repairBadge(node) : null,
      );
      replace(
        list,
        facts(node),
        stragglerText
          ? h("div", { class: "straggler-fact" }, h("dt", {}, "Straggler"), h("dd", { class: "status-straggler" }, stragglerText))
          : null,
      );
    },
    missing() {
      replace(list, emptyState(`Node "${name}" has not reported to this server.`));
    },
  };
}
