// Profiling result: p99 TTFT and TBT against request rate, with the SLO lines and the max rate found.
"use strict";
window.addEventListener("load", function () {
  const result = JSON.parse(document.getElementById("profile-result").textContent);
  const curve = (result.curve || []).slice().sort((a, b) => a.rate - b.rate);
  const ms = (v) => (v === null ? null : v * 1000);
  const traces = [
    { x: curve.map((p) => p.rate), y: curve.map((p) => ms(p.ttft_p99_s)), name: "p99 TTFT (ms)", mode: "lines+markers" },
    { x: curve.map((p) => p.rate), y: curve.map((p) => ms(p.tbt_p99_s)), name: "p99 TBT (ms)", mode: "lines+markers", yaxis: "y2" },
  ];
  const sla = result.sla || {};
  const shapes = [];
  if (sla.ttft_p99_s) shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: sla.ttft_p99_s * 1000, y1: sla.ttft_p99_s * 1000, line: { dash: "dash", color: "#1f77b4" } });
  if (sla.tbt_p99_s) shapes.push({ type: "line", xref: "paper", yref: "y2", x0: 0, x1: 1, y0: sla.tbt_p99_s * 1000, y1: sla.tbt_p99_s * 1000, line: { dash: "dash", color: "#ff7f0e" } });
  if (result.max_rps) shapes.push({ type: "line", yref: "paper", x0: result.max_rps, x1: result.max_rps, y0: 0, y1: 1, line: { color: "#2ca02c" } });
  Plotly.newPlot("chart-profile", traces, {
    height: 360, shapes: shapes, xaxis: { title: { text: "request rate (req/s)" } },
    yaxis: { title: { text: "p99 TTFT (ms)" } }, yaxis2: { title: { text: "p99 TBT (ms)" }, overlaying: "y", side: "right" },
  }, { displayModeBar: false });
});
