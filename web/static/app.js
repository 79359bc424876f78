// edgevirt dashboard: the little JavaScript every page uses.
// - [data-confirm] on a submit button or form: ask before a destructive action;
// - [data-poll="URL"]: replace the element's content with URL's HTML every 2 s, so status
//   changes show without a reload (the server renders the fragment, escaped).
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
      if (r.ok) el.innerHTML = await r.text();
      else if (r.status === 401) window.location = "/ui/login?next=" + encodeURIComponent(location.pathname);
    } catch (_) { /* the server restarts: try again next tick */ }
    busy = false;
  }, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-poll]").forEach(poll);
});
