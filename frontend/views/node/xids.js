// The node page's XID history: each XID its GPUs reported, newest first, with the
// catalog's meaning and action, and the driver's message where it adds to them.
import { repeatsCatalog, xidLabel } from "../../components/events-feed.js";
import { emptyState, errorBox, h, replace } from "../../lib/dom.js";
import { shortUuid, timeEl } from "../../lib/format.js";
import { section, table } from "../../lib/panels.js";

/** update(xids, catalog, gpus): the XID events, the XID catalog, the node's GPUs; fail(error). */
export function xidsPanel() {
  const status = h("div", {}, h("p", { class: "muted" }, "Loading XIDs\u2026"));
  const body = h("tbody");
  const xidTable = table("xid-table", ["Time", "GPU", "XID", "Message"], body);
  xidTable.hidden = true;
  const el = section("xid-heading", "XID history", null, status, h("div", { class: "table-scroll" }, xidTable));

  function update(xids, catalog, gpus) {
    const indexOf = new Map(gpus.map((g) => [g.uuid, g.index]));
    replace(
      body,
      xids.map((event) =>
        h(
          "tr",
          { dataset: { eventId: String(event.id ?? ""), xid: String(event.xid) } },
          h("td", {}, timeEl(event.ts)),
          h(
            "td",
            { class: "mono", title: event.gpu_uuid ?? "" },
            indexOf.has(event.gpu_uuid) ? `GPU ${indexOf.get(event.gpu_uuid)}` : shortUuid(event.gpu_uuid) || "\u2014",
          ),
          h("td", { class: "xid-cell wrap" }, xidLabel(event.xid, catalog)),
          h(
            "td",
            { class: "wrap" },
            event.message && !repeatsCatalog(event.message, event.xid, catalog) ? event.message : "",
          ),
        ),
      ),
    );
    xidTable.hidden = xids.length === 0;
    replace(status, xids.length ? null : emptyState("No XID errors reported by this node."));
  }

  return {
    el,
    update,
    fail(error) {
      replace(status, errorBox("Could not load XIDs", error));
    },
  };
}
