// edgevirt dashboard: the little JavaScript every page uses.
// - [data-confirm] on a submit button or form: ask before a destructive action;
// - [data-poll="URL"]: replace the element's content with URL's HTML every 2 s, so status
//   changes show without a reload (the server renders the fragment, escaped);
// - the VM page's action buttons follow the polled state.
"use strict";

document.addEventListener("submit", (e) => {
  const b = e.submitter;
  const msg = (b && b.dataset.confirm) || e.target.dataset.confirm;
  if (msg && !window.confirm(msg)) e.preventDefault();
});

function poll(el) {
  const url = el.dataset.poll;
  let busy = false;
  setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const r = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      if (r.ok) { el.innerHTML = await r.text(); showAllowedActions(); }
      else if (r.status === 401) window.location = "/ui/login?next=" + encodeURIComponent(location.pathname);
    } catch (_) { /* the server restarts: try again next tick */ }
    busy = false;
  }, 2000);
}

// The VM page's action buttons: only those its current state allows (the status fragment
// names them in #vm-actions-allowed), updated with every poll.
function showAllowedActions() {
  const src = document.getElementById("vm-actions-allowed");
  const form = document.getElementById("actions");
  if (!src || !form) return;
  const allowed = new Set((src.dataset.actions || "").split(" ").filter(Boolean));
  form.querySelectorAll("button[name=action]").forEach((b) => { b.hidden = !allowed.has(b.value); });
  form.querySelectorAll("[data-action]").forEach((a) => { a.hidden = !allowed.has(a.dataset.action); });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-poll]").forEach(poll);
});
