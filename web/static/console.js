// The VNC console page: a one-time ticket, then noVNC over edgevirt's websocket.
import RFB from "/ui/vendor/novnc/core/rfb.js";

const screen = document.getElementById("screen");
const state = document.getElementById("state");
const take = document.getElementById("take");
const csrf = document.querySelector('meta[name="csrf-token"]').content;
const ns = screen.dataset.ns, name = screen.dataset.name;
let rfb = null, connection = null, fit = true;

function say(t) { state.textContent = t; }

async function api(method, path, body) {
  const r = await fetch(path, {
    method, credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(j.message || ("HTTP " + r.status));
  return j;
}

async function connect() {
  let t;
  try {
    t = await api("POST", "/console/tickets", { namespace: ns, name, kind: "vnc" });
  } catch (e) {
    say("Cannot open the console: " + e.message);
    return;
  }
  connection = t.connection;
  const proto = location.protocol === "https:" ? "wss://" : "ws://";
  rfb = new RFB(screen, proto + location.host + t.path, { shared: true });
  rfb.scaleViewport = fit;
  rfb.background = "#111";
  rfb.addEventListener("connect", () => { say("Connected"); refreshControl(); });
  rfb.addEventListener("disconnect", (e) => {
    say(e.detail.clean ? "Disconnected (the VM stopped or the console closed)" : "Connection lost");
    rfb = null;
  });
  rfb.addEventListener("desktopname", (e) => { document.title = e.detail.name + " · edgevirt"; });
}

// Who has control: the server decides; noVNC's viewOnly only mirrors it.
async function refreshControl() {
  if (!rfb || connection === null) return;
  try {
    const s = await api("GET", `/console/state/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`);
    const me = s.viewers.find((v) => v.connection === connection);
    const holder = s.viewers.find((v) => v.kind === "vnc" && v.control);
    const mine = !!(me && me.control);
    rfb.viewOnly = !mine;
    take.hidden = mine;
    say(mine ? "Connected: you have control" :
      "Connected, view only" + (holder ? ` (${holder.user} has control)` : ""));
  } catch (_) { /* keep the last state */ }
}

document.getElementById("cad").addEventListener("click", () => rfb && rfb.sendCtrlAltDel());
document.getElementById("fit").addEventListener("click", (e) => {
  fit = !fit;
  e.target.setAttribute("aria-pressed", String(fit));
  if (rfb) rfb.scaleViewport = fit;
});
take.addEventListener("click", async () => {
  try {
    await api("POST", `/console/control/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`, { connection });
  } catch (e) { say("Could not take control: " + e.message); }
  refreshControl();
});

// Paste as keystrokes: each character as its X keysym (Latin-1 and ASCII map 1:1,
// other Unicode characters to 0x01000000 + code point), newline as Return.
document.getElementById("paste").addEventListener("click", () => {
  if (!rfb) return;
  const text = document.getElementById("paste-text").value;
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    let keysym;
    if (ch === "\n") keysym = 0xff0d;
    else if (ch === "\t") keysym = 0xff09;
    else if (cp >= 0x20 && cp <= 0xff) keysym = cp;
    else keysym = 0x01000000 + cp;
    rfb.sendKey(keysym, null);
  }
});

setInterval(refreshControl, 2000);
connect();
