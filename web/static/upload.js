// edgevirt dashboard: upload an image from the images page, with a progress bar. The file
// goes straight to the API's upload (PUT /apis/edgevirt.io/v1/images/NAME/upload) with the
// session cookie and its CSRF token, in parts of 8 MiB (Content-Range): a part cut off by
// the network is sent again from where the server's copy ends (GET .../upload says), and
// choosing the same file again after a reload resumes it. The server checks the image
// when it has it all.
"use strict";

const PART = 8 * 1024 * 1024;
const TRIES = 5;

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("upload");
  if (!form) return;
  const file = document.getElementById("upload-file");
  const name = document.getElementById("upload-name");
  const bar = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  const cancel = document.getElementById("upload-cancel");
  const start = document.getElementById("upload-start");
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const mib = (n) => (n / 1048576).toFixed(1) + " MiB";
  let xhr = null;
  let cancelled = false;

  // A name from the file's: lower case, '-' for anything else, no extension.
  file.addEventListener("change", () => {
    if (name.value || !file.files.length) return;
    name.value = file.files[0].name.replace(/\.[^.]*$/, "").toLowerCase()
      .replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 63);
  });

  const say = (text, bad) => { status.textContent = text; status.className = bad ? "error" : ""; };
  const iso = document.getElementById("upload-iso");
  const url = () =>
    "/apis/edgevirt.io/v1/images/" + encodeURIComponent(name.value) + "/upload" +
    (iso && iso.checked ? "?type=iso" : "");

  // How much of this upload the server already has.
  async function received() {
    const r = await fetch(url(), { credentials: "same-origin", cache: "no-store" });
    if (!r.ok) return 0;
    return (await r.json()).receivedBytes || 0;
  }

  // Send bytes [from, to) of f; resolves with the answer's status and body.
  function sendPart(f, from, to) {
    return new Promise((resolve, reject) => {
      xhr = new XMLHttpRequest();
      xhr.open("PUT", url());
      xhr.setRequestHeader("X-CSRF-Token", csrf);
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.setRequestHeader("Content-Range", "bytes " + from + "-" + (to - 1) + "/" + f.size);
      xhr.upload.addEventListener("progress", (p) => {
        if (!p.lengthComputable) return;
        const sent = from + p.loaded;
        bar.value = Math.floor((sent / f.size) * 100);
        say("Sent " + mib(sent) + " of " + mib(f.size));
      });
      xhr.upload.addEventListener("load", () => {
        if (to < f.size) return;
        bar.value = 100;
        say("Sent; the server is checking the image...");
      });
      xhr.addEventListener("load", () => resolve({ status: xhr.status, text: xhr.responseText }));
      xhr.addEventListener("error", () => reject(new Error("network")));
      xhr.addEventListener("abort", () => reject(new Error("abort")));
      xhr.send(f.slice(from, to));
    });
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = file.files[0];
    if (!f) return;
    if (f.size === 0) { say("That file is empty.", true); return; }
    cancelled = false;
    start.disabled = true;
    cancel.hidden = false;
    bar.hidden = false;
    bar.value = 0;
    say("Starting...");
    let offset = 0;
    let tries = 0;
    try {
      offset = await received();
      if (offset > f.size) offset = 0;
      if (offset > 0) say("Resuming at " + mib(offset) + " of " + mib(f.size));
      for (;;) {
        const to = Math.min(offset + PART, f.size);
        let answer;
        try {
          answer = await sendPart(f, offset, to);
        } catch (err) {
          if (cancelled || ++tries > TRIES) throw err;
          say("The connection dropped; resuming (try " + tries + " of " + TRIES + ")...");
          await new Promise((r) => setTimeout(r, 1000 * tries));
          offset = await received();
          continue;
        }
        if (answer.status === 201) {
          window.location = "/ui/images?uploaded=" + encodeURIComponent(name.value);
          return;
        }
        if (answer.status === 200) {
          offset = to;
          tries = 0;
          continue;
        }
        if (answer.status === 409 && /send from byte/.test(answer.text)) {
          offset = await received(); // another try of ours got further: go on from there
          continue;
        }
        let msg = "the upload failed (HTTP " + answer.status + ")";
        try { msg = JSON.parse(answer.text).message || msg; } catch (_) { /* not JSON */ }
        say("Refused: " + msg, true);
        break;
      }
    } catch (err) {
      if (cancelled) {
        bar.hidden = true;
        say("Upload stopped; choose the same file and name again to resume where it stopped.");
      } else {
        say("The connection was lost during the upload; choose the same file again to resume.", true);
      }
    }
    start.disabled = false;
    cancel.hidden = true;
  });
  cancel.addEventListener("click", () => { cancelled = true; if (xhr) xhr.abort(); });
});
