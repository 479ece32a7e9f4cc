// The job page's "Nodes of the job" panel: the job's shape from GET /jobs/<job>'s `shape`:
// the nodes that train it, the hot spares waiting in its rendezvous (a spare whose agent
// is down or whose node is cordoned is listed, with why, but is no capacity), the nodes
// an exclusion of the job took out, and its --nnodes MIN:MAX.
import { h, replace } from "../../lib/dom.js";
import { factItems } from "../../lib/panels.js";

const nodeLink = (name) => h("a", { href: `#/nodes/${encodeURIComponent(name)}` }, name);

function joined(items) {
  const out = [];
  items.forEach((item, i) => out.push(i ? ", " : null, item));
  return out;
}

function activeText(shape) {
  if (!shape.active.length) return h("span", { class: "muted" }, "none");
  return h("span", {}, `${shape.active.length}: `, joined(shape.active.map(nodeLink)));
}

function sparesText(shape) {
  if (!shape.spares.length) {
    const why = shape.reported ? "none waiting" : "none seen (no agent listed a launcher of this job)";
    return h("span", { class: "muted" }, why);
  }
  return h(
    "span",
    {},
    `${shape.spare_capacity} ready: `,
    joined(
      shape.spares.map((s) =>
        h(
          "span",
          {
            class: s.available ? "cap cap-yes" : "cap cap-no",
            dataset: { spare: s.node, available: String(s.available) },
            title: `${s.launcher} pid ${s.pid} waits in the rendezvous`,
          },
          nodeLink(s.node),
          s.available ? null : ` (not counted: ${s.why})`,
        ),
      ),
    ),
  );
}

function excludedText(shape) {
  if (!shape.excluded.length) return h("span", { class: "muted" }, "none");
  return joined(
    shape.excluded.map((x) =>
      h(
        "span",
        { dataset: { excluded: x.node }, title: x.reason },
        nodeLink(x.node),
        x.incident_id ? [" (", h("a", { href: `#/incidents/${x.incident_id}` }, `incident ${x.incident_id}`), ")"] : null,
      ),
    ),
  );
}

function nnodesText(shape) {
  if (shape.max_nodes === null || shape.max_nodes === undefined) return h("span", { class: "muted" }, "unknown");
  if (!shape.elastic) return `${shape.max_nodes} (--nnodes ${shape.max_nodes})`;
  return `${shape.min_nodes} to ${shape.max_nodes}, elastic (--nnodes ${shape.min_nodes}:${shape.max_nodes})`;
}

/** update(job) shows GET /jobs/<job>'s shape; clear() empties it. */
export function shapePanel() {
  const list = h("dl", { class: "caps-facts", id: "shape" });
  const el = h(
    "section",
    { class: "panel caps-panel", "aria-labelledby": "shape-heading" },
    h("div", { class: "panel-head" }, h("h2", { id: "shape-heading" }, "Nodes of the job")),
    h(
      "p",
      { class: "muted note" },
      "Which nodes train the job, which wait as hot spares (a torchrun or ft_launcher beyond --nnodes, as each node's agent sees it) and which an exclusion took out.",
    ),
    list,
  );
  return {
    el,
    update(j) {
      const shape = j.shape;
      if (!shape) {
        replace(list, h("p", { class: "muted" }, "not reported by this server"));
        return;
      }
      replace(
        list,
        factItems([
          ["Training", h("span", { dataset: { field: "active" } }, activeText(shape))],
          ["Hot spares", h("span", { dataset: { field: "spares", capacity: String(shape.spare_capacity) } }, sparesText(shape))],
          ["Excluded", h("span", { dataset: { field: "excluded" } }, excludedText(shape))],
          ["Nodes", h("span", { dataset: { field: "nnodes" } }, nnodesText(shape))],
        ]),
      );
    },
    clear() {
      replace(list);
    },
  };
}
