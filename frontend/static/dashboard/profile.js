// Profiling result: p99 TTFT and TBT against request rate, with the SLO lines and the max rate found.
"use strict";
window.addEventListener("load", function () {
  const data = document.getElementById("profile-result");
  if (!data) return;  // no result (yet): the page reloads when the job finishes
  const result = JSON.parse(data.textContent);
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
  // Name the lines: dashed ones are the SLOs, the solid green one the max rate found.
  const notes = [];
  const note = (extra, text) => notes.push(Object.assign({ text: text, showarrow: false, font: { size: 11 } }, extra));
  if (sla.ttft_p99_s) note({ xref: "paper", x: 0, xanchor: "left", y: sla.ttft_p99_s * 1000, yanchor: "bottom" }, "TTFT SLO");
  if (sla.tbt_p99_s) note({ xref: "paper", x: 1, xanchor: "right", yref: "y2", y: sla.tbt_p99_s * 1000, yanchor: "bottom" }, "TBT SLO");
  if (result.max_rps) note({ x: result.max_rps, xanchor: "left", yref: "paper", y: 1, yanchor: "bottom" }, "max rate");
  // Plotly's autorange ignores shapes: from 0 to above both the curve and the SLO line.
  function range(values, sloS) {
    const top = Math.max(sloS ? sloS * 1000 : 0, ...values.filter((v) => v !== null));
    return [0, (top || 1) * 1.15];
  }
  Plotly.newPlot("chart-profile", traces, {
    height: 360, shapes: shapes, annotations: notes, xaxis: { title: { text: "request rate (req/s)" }, rangemode: "tozero" },
    yaxis: { title: { text: "p99 TTFT (ms)" }, range: range(traces[0].y, sla.ttft_p99_s) },
    yaxis2: { title: { text: "p99 TBT (ms)" }, overlaying: "y", side: "right", showgrid: false, tickmode: "auto", range: range(traces[1].y, sla.tbt_p99_s) },
    legend: { orientation: "h", x: 0, y: 1.12 },
  }, { displayModeBar: false });
});
