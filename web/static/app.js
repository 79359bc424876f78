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

// Ages as kubectl rounds them (45s, 3m20s, 2h5m, 4d, 2y3d), kept current from each
// <time class="age" datetime>: the server does not resend a row only because it aged.
function humanDuration(s) {
  const w = (big, u, small, su) => (small === 0 ? big + u : big + u + small + su);
  const m = Math.floor(s / 60), h = Math.floor(s / 3600), d = Math.floor(h / 24);
  if (s < 120) return Math.max(s, 0) + "s";
  if (m < 10) return w(m, "m", s % 60, "s");
  if (m < 180) return m + "m";
  if (h < 8) return w(h, "h", m % 60, "m");
  if (h < 48) return h + "h";
  if (h < 24 * 8) return w(d, "d", h % 24, "h");
  if (h < 24 * 365 * 2) return d + "d";
  if (h < 24 * 365 * 8) return w(Math.floor(d / 365), "y", d % 365, "d");
  return Math.floor(d / 365) + "y";
}
function ages() {
  const now = Date.now();
  document.querySelectorAll("time.age[datetime]").forEach((t) => {
    const at = Date.parse(t.dateTime);
    if (!Number.isNaN(at)) t.textContent = humanDuration(Math.floor((now - at) / 1000));
  });
}

// A region sends back what it holds, so an unchanged poll costs a 304 and no body: the
// VM list its rows' digest (X-Rows-Have; the server answers with only the rows that
// changed, or the whole table when rows came or went), other regions their last ETag.
function poll(el) {
  const url = el.dataset.poll;
  let busy = false;
  let etag = null;
  setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const headers = { "Accept": "text/html" };
      const rows = el.dataset.rows !== undefined;
      if (rows) headers["X-Rows-Have"] = el.dataset.rows;
      else if (etag) headers["If-None-Match"] = etag;
      const r = await fetch(url, { credentials: "same-origin", cache: "no-store", headers });
      if (r.status === 304) {
        ages();
        freshness(true);
      } else if (r.ok) {
        const html = await r.text();
        if (rows && r.headers.get("X-Rows") === "delta") {
          const t = document.createElement("tbody");
          t.innerHTML = html;
          for (const tr of [...t.children]) {
            const old = el.querySelector('tr[data-key="' + CSS.escape(tr.dataset.key) + '"]');
            if (old) old.replaceWith(tr);
          }
        } else {
          el.innerHTML = html;
        }
        if (rows) el.dataset.rows = r.headers.get("X-Rows-Digest") || "";
        else etag = r.headers.get("ETag");
        showAllowedActions();
        ages();
        freshness(true);
      } else if (r.status === 401) window.location = "/ui/login?next=" + encodeURIComponent(location.pathname);
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
