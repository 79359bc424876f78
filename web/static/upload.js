// edgevirt dashboard: upload an image from the images page, with a progress bar. The file
// goes straight to the API's streaming upload (PUT /apis/edgevirt.io/v1/images/NAME/upload)
// with the session cookie and its CSRF token; the server checks the image when it has it all.
"use strict";

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

  // A name from the file's: lower case, '-' for anything else, no extension.
  file.addEventListener("change", () => {
    if (name.value || !file.files.length) return;
    name.value = file.files[0].name.replace(/\.[^.]*$/, "").toLowerCase()
      .replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 63);
  });

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const f = file.files[0];
    if (!f) return;
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", "/apis/edgevirt.io/v1/images/" + encodeURIComponent(name.value) + "/upload");
    xhr.setRequestHeader("X-CSRF-Token", csrf);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    bar.hidden = false;
    bar.value = 0;
    start.disabled = true;
    cancel.hidden = false;
    const mib = (n) => (n / 1048576).toFixed(1) + " MiB";
    xhr.upload.addEventListener("progress", (p) => {
      if (!p.lengthComputable) return;
      bar.value = Math.floor((p.loaded / p.total) * 100);
      status.textContent = "Sent " + mib(p.loaded) + " of " + mib(p.total);
    });
    xhr.upload.addEventListener("load", () => {
      bar.value = 100;
      status.textContent = "Sent; the server is checking the image...";
    });
    const done = () => { start.disabled = false; cancel.hidden = true; };
    xhr.addEventListener("load", () => {
      done();
      if (xhr.status === 201) {
        window.location = "/ui/images?uploaded=" + encodeURIComponent(name.value);
        return;
      }
      let msg = "the upload failed (HTTP " + xhr.status + ")";
      try { msg = JSON.parse(xhr.responseText).message || msg; } catch (_) { /* not JSON */ }
      status.textContent = "Refused: " + msg;
      status.className = "error";
    });
    xhr.addEventListener("error", () => { done(); status.textContent = "The connection was lost during the upload."; status.className = "error"; });
    xhr.addEventListener("abort", () => { done(); bar.hidden = true; status.textContent = "Upload cancelled."; });
    cancel.onclick = () => xhr.abort();
    status.className = "";
    status.textContent = "Starting...";
    xhr.send(f);
  });
});
