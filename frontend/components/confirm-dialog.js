// A modal confirmation with a reason (and any other fields), on the native <dialog>:
// focus moves into it and stays there, Escape cancels, and the action runs from inside,
// so a refused request (403 without an operator token, 409 with the server's reason ...)
// is shown where the operator is looking and the dialog stays open to try again.
import { h } from "../lib/dom.js";

/** A refused request in words: the server's own reason, without the bare status code. */
export function refusal(error) {
  const detail = error.detail ?? error.message;
  if (error.status === 403) return `Refused: this needs an operator token (${detail}).`;
  if (error.status === 409) return `Refused by the server: ${sentence(detail)}`;
  if (error.status === 404) return `Not found: ${sentence(detail)}`;
  if (error.status === 422) return `The server did not accept this: ${sentence(detail)}`;
  return `Failed: ${error.message}`;
}

function sentence(text) {
  const t = String(text ?? "").trim();
  return !t || /[.!?]$/.test(t) ? t : `${t}.`;
}

/**
 * confirmDialog({title, text, confirmLabel, danger, fields, action, onRefused, signal})
 * fields: [{name, label, kind: "textarea" | "select" | "checkbox", options: [[value, label]],
 *           value, required, help, hidden}]
 * action(values) -> result: may throw; its message is shown in the dialog (a 409 as the
 * server's reason) and onRefused(error, {reveal}) is called, e.g. to re-read what changed
 * or to reveal(name) a hidden field the refusal offers (a checkbox's value is a boolean).
 * Resolves to the action's result, or null when cancelled.
 */
export function confirmDialog({
  title,
  text = "",
  confirmLabel = "Confirm",
  danger = false,
  fields = [],
  action,
  onRefused,
  signal,
}) {
  return new Promise((resolve) => {
    const inputs = new Map();
    const rowOf = new Map();
    const rows = fields.map((field) => {
      const id = `dlg-${field.name}`;
      let input;
      if (field.kind === "checkbox") {
        input = h("input", { type: "checkbox", id, name: field.name, checked: Boolean(field.value) });
      } else if (field.kind === "select") {
        input = h(
          "select",
          { id, name: field.name },
          field.options.map(([value, label]) =>
            h("option", { value, selected: value === field.value }, label),
          ),
        );
      } else {
        input = h("textarea", {
          id,
          name: field.name,
          rows: 3,
          maxlength: 500,
          required: field.required,
          placeholder: field.placeholder ?? null,
        });
        input.value = field.value ?? "";
      }
      inputs.set(field.name, input);
      if (field.help) input.setAttribute("aria-describedby", `${id}-help`);
      const help = field.help ? h("p", { class: "muted field-help", id: `${id}-help` }, field.help) : null;
      const row =
        field.kind === "checkbox"
          ? h("div", { class: "field field-check", hidden: Boolean(field.hidden) }, h("label", { for: id }, input, " ", field.label), help)
          : h("div", { class: "field", hidden: Boolean(field.hidden) }, h("label", { for: id }, field.label), input, help);
      rowOf.set(field.name, row);
      return row;
    });
    const reveal = (name) => {
      const row = rowOf.get(name);
      if (!row) return;
      row.hidden = false;
      inputs.get(name).focus();
    };
    const message = h("p", { class: "dialog-message", role: "alert" });
    const cancel = h("button", { type: "button", class: "btn" }, "Cancel");
    const confirm = h(
      "button",
      { type: "submit", class: danger ? "btn btn-danger" : "btn btn-primary" },
      confirmLabel,
    );
    const form = h(
      "form",
      { method: "dialog", novalidate: true },
      h("h2", {}, title),
      text ? h("p", {}, text) : null,
      rows,
      message,
      h("div", { class: "dialog-buttons" }, cancel, confirm),
    );
    const dialog = h("dialog", { class: "confirm-dialog", "aria-label": title }, form);
    document.body.append(dialog);

    let done = false;
    function finish(result) {
      if (done) return;
      done = true;
      signal?.removeEventListener("abort", onAbort);
      if (dialog.open) dialog.close();
      dialog.remove();
      resolve(result);
    }
    const onAbort = () => finish(null);
    signal?.addEventListener("abort", onAbort);

    cancel.addEventListener("click", () => finish(null));
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      finish(null);
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const values = Object.fromEntries(
        [...inputs].map(([name, el]) => [name, el.type === "checkbox" ? el.checked : el.value.trim()]),
      );
      const empty = fields.find((f) => f.required && !values[f.name]);
      if (empty) {
        message.textContent = `${empty.label}: required.`;
        inputs.get(empty.name).focus();
        return;
      }
      confirm.disabled = true;
      cancel.disabled = true;
      message.textContent = "Sending\u2026";
      try {
        const result = await action(values);
        finish(result ?? true);
      } catch (error) {
        if (error.name === "AbortError") return finish(null);
        message.textContent = refusal(error);
        onRefused?.(error, { reveal });
        confirm.disabled = false;
        cancel.disabled = false;
      }
    });
    dialog.showModal();
    (inputs.values().next().value ?? confirm).focus();
  });
}
