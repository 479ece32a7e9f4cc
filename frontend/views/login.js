// Sign-in: a bearer token, checked against the API before it is kept (sessionStorage:
// this tab only).
import { apiGet } from "../api.js";
import { h, replace } from "../lib/dom.js";

export const title = "Sign in";

/** ctx: {message, onLogin(token)} */
export function mount(root, ctx) {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    "aria-describedby": "token-help",
  });
  const button = h("button", { type: "submit" }, "Sign in");
  const message = h("p", { class: "login-message", role: "alert" }, ctx.message ?? "");
  const form = h(
    "form",
    { class: "login panel", novalidate: true },
    h("h1", {}, "Sign in to trainguard"),
    h("label", { for: "token" }, "Access token"),
    input,
    h(
      "p",
      { id: "token-help", class: "muted" },
      "An API token with the viewer or operator role (or the server's TRAINGUARD_ADMIN_TOKEN). ",
      "It is kept in this browser tab only.",
    ),
    button,
    message,
  );

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) {
      message.textContent = "Enter a token.";
      input.focus();
      return;
    }
    button.disabled = true;
    message.textContent = "Checking\u2026";
    try {
      await apiGet("nodes", {}, { token });
      ctx.onLogin(token);
    } catch (error) {
      message.textContent =
        error.status === 401 || error.status === 403
          ? `The server rejected this token (${error.status}).`
          : `Could not sign in: ${error.message}`;
      button.disabled = false;
      input.select();
    }
  });

  replace(root, form);
  input.focus();
  return () => {};
}
