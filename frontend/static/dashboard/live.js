// Shared helpers: one websocket per live view, reconnecting with back-off; byte formatting.
// A socket whose access is gone (the session signed out or expired, the user deactivated or left
// without a role) is not retried: the browser goes to the sign-in page, and back here after it.
"use strict";
window.Live = (function () {
  const LOGIN_URL = "/accounts/login/";  // settings.LOGIN_URL
  const CLOSE_ACCESS_REVOKED = 4401;  // dashboard/consumers.py: the server's re-check found access gone
  function setStatus(state, text) {
    const el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }
  function signIn() {
    setStatus("down", "signed out; opening the sign-in page…");
    const next = location.pathname + location.search;
    location.assign(LOGIN_URL + "?" + new URLSearchParams({ next: next }).toString());
  }
  // A refused handshake (HTTP 403: no session, or no platform role) reaches the page as a close
  // with code 1006 before any open, as a server that is down or restarting does. The page itself
  // tells them apart: it is redirected to the sign-in page (or refused) once access is gone, and
  // unreachable while the server is down (retried then, as any other drop).
  function accessGone() {
    return fetch(location.href, { credentials: "same-origin", cache: "no-store" }).then(
      function (response) {
        if (response.status === 401 || response.status === 403) return true;
        return response.redirected && new URL(response.url).pathname === LOGIN_URL;
      },
      function () { return false; }
    );
  }
  function open(path, onMessage) {
    let delay = 500;
    function connect() {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const ws = new WebSocket(scheme + location.host + path);
      let opened = false;
      ws.onopen = function () { opened = true; delay = 500; setStatus("live", "live"); };
      ws.onmessage = function (event) { onMessage(JSON.parse(event.data)); };
      ws.onclose = function (event) {
        if (event.code === CLOSE_ACCESS_REVOKED) { signIn(); return; }
        setStatus("down", "disconnected; retrying…");
        const wait = delay;
        delay = Math.min(delay * 2, 10000);
        if (opened) { setTimeout(connect, wait); return; }
        accessGone().then(function (gone) {
          if (gone) signIn(); else setTimeout(connect, wait);
        });
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
