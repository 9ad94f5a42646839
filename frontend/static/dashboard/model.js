// Model charts: history from the page, new samples appended from the model socket (deltas only).
"use strict";
(function () {
  const root = document.getElementById("model-charts");
  const history = JSON.parse(document.getElementById("model-history").textContent);
  const slo = JSON.parse(document.getElementById("model-slo").textContent);
  const charts = [
    { id: "chart-ttft", title: "TTFT (ms)", series: [["ttft_p50", "p50", 1000], ["ttft_p99", "p99", 1000]], slo: slo.ttft_ms },
    { id: "chart-tbt", title: "Time between tokens (ms)", series: [["tbt_p50", "p50", 1000], ["tbt_p99", "p99", 1000]], slo: slo.tbt_ms },
    { id: "chart-rate", title: "Request rate (req/s)", series: [["rate", "req/s", 1]] },
    { id: "chart-queue", title: "Requests", series: [["running", "running", 1], ["waiting", "waiting", 1]] },
    { id: "chart-preempt", title: "Preemptions and bytes offloaded", series: [["preemptions", "preemptions", 1], ["offloaded", "MiB offloaded", 1 / 1048576]] },
  ];
  const deployments = Object.keys(history);
  function traces(chart) {
    const out = [];
    for (const dep of deployments) {
      for (const [field, name, scale] of chart.series) {
        const pts = history[dep];
        out.push({
          x: pts.map((p) => p.ts), y: pts.map((p) => (p[field] === null ? null : p[field] * scale)),
          name: "#" + dep + " " + name, mode: "lines+markers", type: "scatter",
        });
      }
    }
    return out;
  }
  // Plotly's autorange ignores shapes: scale SLO charts so the SLO line is always in view.
  function sloRange(chart) {
    let top = chart.slo;
    for (const dep of deployments) {
      for (const [field, , scale] of chart.series) {
        for (const p of history[dep]) if (p[field] !== null) top = Math.max(top, p[field] * scale);
      }
    }
    return [0, top * 1.15];
  }
  function hasPoints() {
    return deployments.some((dep) => history[dep].length > 0);
  }
  function layout(chart) {
    const l = { title: { text: chart.title }, height: 260, margin: { l: 50, r: 10, t: 40, b: 40 }, xaxis: { type: "date" } };
    l.annotations = [];
    if (!hasPoints()) {
      // Nothing to draw: an empty date axis would span Jan to Dec 2000. Show the last 10 minutes
      // (the history the page loads), in UTC as the samples' times are drawn, and say why it is empty.
      const now = Date.now();
      l.xaxis.range = [new Date(now - 600000).toISOString(), new Date(now).toISOString()];
      l.annotations.push({ xref: "paper", yref: "paper", x: 0.5, y: 0.5, text: "no samples yet", showarrow: false });
    }
    // Every series is a count, rate, size or time: the axis starts at 0 (autorange around a flat
    // line drew -1..1 for an idle engine's 0 requests, 1..3 for a steady 2 req/s).
    l.yaxis = { rangemode: "tozero" };
    if (chart.slo) {
      l.yaxis = { range: sloRange(chart) };
      l.shapes = [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: chart.slo, y1: chart.slo, line: { color: "#c0392b", dash: "dash" } }];
      l.annotations.push({ xref: "paper", x: 1, y: chart.slo, text: "SLO", showarrow: false, xanchor: "right", yanchor: "bottom" });
    }
    return l;
  }
  function draw() {
    for (const chart of charts) Plotly.newPlot(chart.id, traces(chart), layout(chart), { displayModeBar: false, responsive: true });
  }
  function append(dep, incoming) {
    if (!(dep in history)) { history[dep] = []; deployments.push(dep); draw(); }
    // The socket's first push may repeat samples the page already drew: keep only newer ones.
    const known = history[dep].length ? history[dep][history[dep].length - 1].ts : "";
    const points = incoming.filter((p) => p.ts > known);
    if (!points.length) return;
    const wasEmpty = !hasPoints();
    history[dep].push(...points);
    if (wasEmpty) { draw(); return; }  // the first points: drop the empty charts' fixed range and note
    const index = deployments.indexOf(dep);
    for (const chart of charts) {
      const n = chart.series.length;
      const update = { x: [], y: [] };
      const which = [];
      chart.series.forEach(function ([field, , scale], i) {
        update.x.push(points.map((p) => p.ts));
        update.y.push(points.map((p) => (p[field] === null ? null : p[field] * scale)));
        which.push(index * n + i);
      });
      Plotly.extendTraces(chart.id, update, which, 3600);
      if (chart.slo) Plotly.relayout(chart.id, { "yaxis.range": sloRange(chart) });
    }
  }
  window.addEventListener("load", function () {
    draw();
    Live.open(root.dataset.socket, function (message) {
      if (message.type === "points") append(String(message.deployment), message.points);
      if (message.type === "summary" && "attainment" in message.set) {
        // Over the last minute of windows only (dashboard/snapshots.py ATTAINMENT_WINDOW).
        const a = message.set.attainment;
        const shown = document.getElementById("attainment");
        shown.textContent = a === null ? shown.dataset.empty : a.toFixed(1) + "%";
      }
      if (message.type === "summary" && "deployments" in message.set) {
        // Each listed deployment's state as its agent reports it (pending -> starting -> running).
        for (const [dep, state] of Object.entries(message.set.deployments)) {
          const shown = document.querySelector('#deployments [data-deployment="' + dep + '"] .deployment-state');
          if (shown) shown.textContent = state;
        }
      }
    });
  });
})();
