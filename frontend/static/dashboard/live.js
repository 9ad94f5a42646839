// Shared helpers: one websocket per live view, reconnecting with back-off; byte formatting.
"use strict";
window.Live = (function () {
  function setStatus(state, text) {
    const el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }
  function open(path, onMessage) {
    let delay = 500;
    function connect() {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const ws = new WebSocket(scheme + location.host + path);
      ws.onopen = function () { delay = 500; setStatus("live", "live"); };
      ws.onmessage = function (event) { onMessage(JSON.parse(event.data)); };
      ws.onclose = function () {
        setStatus("down", "disconnected; retrying…");
        setTimeout(connect, delay);
        delay = Math.min(delay * 2, 10000);
      };
    }
    connect();
  }
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + units[i];
  }
  function applyDelta(state, message) {
    if (message.type === "snapshot") {
      for (const k of Object.keys(state)) delete state[k];
      Object.assign(state, message.data);
    } else if (message.type === "delta") {
      Object.assign(state, message.set);
      for (const k of message.remove) delete state[k];
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[data-socket]")) {
      const el = document.getElementById("live-status");
      if (el) el.hidden = true;
    }
  });
  return { open: open, bytes: bytes, applyDelta: applyDelta };
})();
