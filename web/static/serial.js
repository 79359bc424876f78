// The serial console page: a one-time ticket, then xterm.js over edgevirt's websocket.
import { Terminal } from "/ui/vendor/xterm/lib/xterm.mjs";

const el = document.getElementById("terminal");
const state = document.getElementById("state");
const csrf = document.querySelector('meta[name="csrf-token"]').content;

// The size of one character cell in the terminal's font, measured as xterm.js does.
function cellSize(term) {
  const probe = document.createElement("span");
  probe.style.fontFamily = term.options.fontFamily;
  probe.style.fontSize = term.options.fontSize + "px";
  probe.style.position = "absolute";
  probe.style.visibility = "hidden";
  probe.style.whiteSpace = "pre";
  probe.textContent = "W".repeat(64);
  document.body.appendChild(probe);
  const r = probe.getBoundingClientRect();
  probe.remove();
  return { w: r.width / 64, h: r.height };
}

// As many columns as the page's width holds and rows as the window's height below the
// terminal does (at least 20 x 10): the terminal fits its box on a phone and a wide screen.
function fit(term) {
  const c = cellSize(term);
  if (!c.w || !c.h) return;
  const cols = Math.max(20, Math.floor((el.clientWidth - 8) / c.w));
  const below = window.innerHeight - el.getBoundingClientRect().top - 56;
  const rows = Math.max(10, Math.min(60, Math.floor(below / c.h)));
  if (cols !== term.cols || rows !== term.rows) term.resize(cols, rows);
}

async function connect() {
  const r = await fetch("/console/tickets", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify({ namespace: el.dataset.ns, name: el.dataset.name, kind: "serial" }),
  });
  const t = await r.json().catch(() => ({}));
  if (!r.ok) { state.textContent = "Cannot open the serial console: " + (t.message || r.status); return; }
  const term = new Terminal({ convertEol: false, cursorBlink: true, rows: 30, cols: 100 });
  term.open(el);
  fit(term);
  window.addEventListener("resize", () => fit(term));
  const proto = location.protocol === "https:" ? "wss://" : "ws://";
  const ws = new WebSocket(proto + location.host + t.path, ["binary"]);
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  ws.onopen = () => { state.textContent = "Connected (press Enter for a prompt)"; term.focus(); };
  ws.onmessage = (e) => term.write(new Uint8Array(e.data));
  ws.onclose = () => { state.textContent = "Disconnected"; };
  term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
}

connect();
