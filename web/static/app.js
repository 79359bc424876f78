// edgevirt dashboard: the little JavaScript every page uses.
// - [data-confirm] on a submit button or form: ask before a destructive action;
// - [data-copy] on a button: copy another element's text;
// - [data-poll="URL"]: replace the element's content with URL's HTML every 2 s, so status
//   changes show without a reload (the server renders the fragment, escaped), with the time
//   of the last refresh, and a banner as soon as a refresh fails;
// - the VM page's action buttons follow the polled state.
"use strict";

document.addEventListener("submit", (e) => {
  const b = e.submitter;
  const msg = (b && b.dataset.confirm) || e.target.dataset.confirm;
  if (msg && !window.confirm(msg)) e.preventDefault();
});

// [data-copy="ID"]: copy the text of element ID (a command to paste on another host).
document.addEventListener("click", async (e) => {
  const b = e.target.closest("[data-copy]");
  if (!b) return;
  const text = document.getElementById(b.dataset.copy).textContent;
  try {
    await navigator.clipboard.writeText(text);
    b.textContent = "Copied";
  } catch (_) {
    // No clipboard (plain HTTP, or denied): select the text for the person to copy.
    window.getSelection().selectAllChildren(document.getElementById(b.dataset.copy));
    b.textContent = "Selected: press Ctrl+C";
  }
});

// When the live regions last got fresh data, and whether the last try failed: a page that
// cannot reach the server says so at once instead of showing old states as current.
let lastFresh = null;
function freshness(ok) {
  const stale = document.getElementById("stale");
  const refreshed = document.getElementById("refreshed");
  if (ok) {
    lastFresh = new Date();
    if (stale) stale.hidden = true;
    if (refreshed) {
      refreshed.hidden = false;
      const t = document.getElementById("refreshed-at");
      t.dateTime = lastFresh.toISOString();
      t.textContent = lastFresh.toLocaleTimeString();
    }
  } else if (stale) {
    if (lastFresh) document.getElementById("stale-since").textContent = lastFresh.toLocaleTimeString();
    stale.hidden = false;
  }
}

function poll(el) {
  const url = el.dataset.poll;
  let busy = false;
  setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const r = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      if (r.ok) { el.innerHTML = await r.text(); showAllowedActions(); freshness(true); }
      else if (r.status === 401) window.location = "/ui/login?next=" + encodeURIComponent(location.pathname);
      else freshness(false);
    } catch (_) {
      freshness(false); // the server is down or restarting: try again next tick
    }
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
  document.querySelectorAll("main [data-action]").forEach((a) => { a.hidden = !allowed.has(a.dataset.action); });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-poll]").forEach(poll);
});
