// edgevirt dashboard: the graphs of a VM or a node, drawn with uPlot from
// [data-graphs="URL"] (URL?range=hour|day|week|month answers {step, times, series}).
// Each chart's <figure> gets data-samples: how many points it drew (for people reading the
// page source, and for the browser test).
"use strict";

(() => {
  const CHARTS = {
    cpu: { series: [["cpu", "CPU", "#2b6cb0"]], fmt: (v) => v.toFixed(2) },
    memory: { series: [["memory", "Used", "#2f855a"]], fmt: bytes },
    disk: { series: [["diskRead", "Read", "#2b6cb0"], ["diskWrite", "Write", "#c05621"]], fmt: bytes },
    net: { series: [["netIn", "In", "#2b6cb0"], ["netOut", "Out", "#c05621"]], fmt: bytes },
    used: { series: [["diskUsed", "Used", "#6b46c1"]], fmt: bytes },
  };

  function bytes(v) {
    if (v == null) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : Math.round(v)) + " " + units[i];
  }

  function draw(section, data) {
    const byName = {};
    for (const [name, values] of data.series || []) byName[name] = values;
    section.querySelectorAll("figure[data-chart]").forEach((fig) => {
      const spec = CHARTS[fig.dataset.chart];
      if (!spec) return;
      const cols = spec.series.map(([name]) => byName[name] || data.times.map(() => null));
      const samples = cols.reduce((n, c) => n + c.filter((v) => v != null).length, 0);
      const width = Math.max(240, Math.min(fig.clientWidth || 480, 640));
      const opts = {
        width,
        height: 160,
        series: [{}].concat(spec.series.map(([, label, stroke]) => ({
          label, stroke, width: 2, spanGaps: false,
          // Points too: a lone sample between gaps (a VM that just started) shows.
          points: { show: true, size: 5, fill: stroke },
          value: (u, v) => (v == null ? "-" : spec.fmt(v)),
        }))),
        axes: [{}, { size: 84, values: (u, vals) => vals.map((v) => spec.fmt(v)) }],
        scales: { x: { time: true } },
        legend: { show: true },
      };
      if (fig._plot) fig._plot.destroy();
      fig.querySelectorAll(".uplot").forEach((e) => e.remove());
      fig._plot = new uPlot(opts, [data.times].concat(cols), fig);
      fig.dataset.samples = String(samples);
    });
  }

  function start(section) {
    let range = "hour";
    const load = async () => {
      try {
        const r = await fetch(section.dataset.graphs + "?range=" + range, { credentials: "same-origin" });
        if (r.status === 401) { window.location = "/ui/login?next=" + encodeURIComponent(location.pathname); return; }
        if (r.ok) draw(section, await r.json());
      } catch (_) { /* the server restarts: the next refresh draws */ }
    };
    section.querySelectorAll("button[data-range]").forEach((b) => {
      b.addEventListener("click", () => {
        range = b.dataset.range;
        section.querySelectorAll("button[data-range]").forEach((x) => x.classList.toggle("selected", x === b));
        load();
      });
    });
    load();
    setInterval(() => { if (!document.hidden) load(); }, 15000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-graphs]").forEach(start);
  });
})();
