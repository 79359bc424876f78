// The serial console page: a one-time ticket, then xterm.js over edgevirt's websocket.
import { Terminal } from "/ui/vendor/xterm/lib/xterm.mjs";

const el = document.getElementById("terminal");
const state = document.getElementById("state");
const csrf = document.querySelector('meta[name="csrf-token"]').content;

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
