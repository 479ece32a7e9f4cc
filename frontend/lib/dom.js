// Tiny DOM helpers: build elements from data without innerHTML, so text from the API
// (node names, event messages) is never parsed as markup.

/**
 * h("a", {href: "#/", class: "link"}, "text", child, [more, children])
 * props: class, dataset {...}, on<event>: fn, true -> empty attribute, false/null -> skipped.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Replace all children of el. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A visible, announced error line. */
export function errorBox(what, error) {
  return h("p", { class: "error", role: "alert" }, `${what}: ${error.message ?? error}`);
}

/** An honest empty state. */
export function emptyState(text) {
  return h("p", { class: "empty" }, text);
}
