// Shared helpers: one websocket per live view, reconnecting with back-off; byte formatting.
// A socket whose access is gone (the session signed out or expired, the user deactivated or left
// without a role) is not retried: the browser goes to the sign-in page, and back here after it.
// Nor is one whose page's subject was deleted (a model, a deployment): the page says so and stops.
"use strict";
window.Live = (function () {
  const LOGIN_URL = "/accounts/login/";  // settings.LOGIN_URL
  const CLOSE_ACCESS_REVOKED = 4401;  // dashboard/consumers.py: the server's re-check found access gone
  const CLOSE_GONE = 4404;  // dashboard/consumers.py: the page's subject was deleted while it was open
  // dashboard/socket_slots.py: the user's other live views (tabs) hold every socket they may open.
  // Retried this rarely, not with the drop back-off (each of these sockets opens, resetting it).
  const CLOSE_TOO_MANY_SOCKETS = 4429;
  const TOO_MANY_RETRY_MS = 15000;
  // A 4401 within this long of the previous one is the server refusing again, not a new rotation:
  // longer than the server's re-check period (DASHBOARD_AUTH_RECHECK_S, 5 s) plus the longest
  // back-off (10 s), so a server that keeps closing new sockets with 4401 stays backed off.
  const REVOKED_AGAIN_MS = 30000;
  function setStatus(state, text) {
    const el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }
  // The page to check access at and to come back to after signing in: the one shown, unless the
  // template names another (a page rendered in answer to a POST names the page a GET loads).
  function pageUrl() {
    return document.body.dataset.page || location.pathname + location.search;
  }
  function signIn() {
    setStatus("down", "signed out; opening the sign-in page…");
    const next = pageUrl();
    location.assign(LOGIN_URL + "?" + new URLSearchParams({ next: next }).toString());
  }
  function stop() {
    setStatus("down", "this no longer exists; nothing more will arrive");
  }
  // Whether this browser may still see the page: "gone" once the page is redirected to the sign-in
  // page or refused (401/403), "missing" once what it shows was deleted (404/410: the socket's
  // handshake is refused for the same reason), "ok" while it loads (2xx), "unknown" while the
  // server is down or failing. A socket's close does not tell these apart by itself:
  // - a refused handshake (HTTP 403: no session, or no platform role) reaches the page as a close
  //   with code 1006 before any open, as a server that is down or restarting does;
  // - a 4401 says the session the socket got at its handshake is gone, which it also is when the
  //   browser is still signed in under a new key: Django rotates the key when the user changes
  //   their own password (update_session_auth_hash) or signs in again.
  function pageAccess() {
    return fetch(pageUrl(), { credentials: "same-origin", cache: "no-store" }).then(
      function (response) {
        if (response.status === 401 || response.status === 403) return "gone";
        if (response.status === 404 || response.status === 410) return "missing";
        if (response.redirected && new URL(response.url).pathname === LOGIN_URL) return "gone";
        return response.ok ? "ok" : "unknown";
      },
      function () { return "unknown"; }
    );
  }
  function open(path, onMessage) {
    let delay = 500;  // wait before the next retry of a drop; back to 500 once a socket opens
    let revokedAt = -Infinity;  // Date.now() of the last 4401
    let revokedWait = 0;  // wait before reconnecting after a 4401 while the page still loads
    function connect() {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const ws = new WebSocket(scheme + location.host + path);
      let opened = false;
      ws.onopen = function () { opened = true; delay = 500; setStatus("live", "live"); };
      ws.onmessage = function (event) { onMessage(JSON.parse(event.data)); };
      ws.onclose = function (event) {
        if (event.code === CLOSE_ACCESS_REVOKED) { revoked(); return; }
        if (event.code === CLOSE_GONE) { stop(); return; }  // a reconnect would only be refused
        if (event.code === CLOSE_TOO_MANY_SOCKETS) {
          setStatus("down", "too many live views open (close other tabs); retrying…");
          setTimeout(connect, TOO_MANY_RETRY_MS);
          return;
        }
        setStatus("down", "disconnected; retrying…");
        const wait = delay;
        delay = Math.min(delay * 2, 10000);
        if (opened) { setTimeout(connect, wait); return; }
        pageAccess().then(function (access) {
          if (access === "gone") signIn();
          else if (access === "missing") stop();
          else setTimeout(connect, wait);
        });
      };
    }
    // A 4401 close: signed out for good goes to the sign-in page; still signed in (a rotated key)
    // reconnects at once, the new socket carrying the browser's new session cookie. Every socket
    // opens before its 4401, so the back-off here is its own (not reset by an open): after the
    // first 4401 in a while, reconnects wait 0.5 s, doubled up to 10 s, as other reconnects do.
    function revoked() {
      setStatus("down", "re-checking access…");
      const now = Date.now();
      if (now - revokedAt >= REVOKED_AGAIN_MS) revokedWait = 0;
      revokedAt = now;
      const wait = revokedWait;
      revokedWait = Math.min(Math.max(wait * 2, 500), 10000);
      pageAccess().then(function (access) {
        if (access === "gone") signIn();
        else if (access === "missing") stop();
        else if (access === "ok" && wait === 0) connect();
        else setTimeout(connect, Math.max(wait, 500));  // the server is failing, or keeps refusing
      });
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
  // A <time> for an ISO 8601 time from a frame, written as the pages write theirs (the utc_time
  // filter): "2026-01-02 03:04:05 UTC", with the ISO time as its datetime; text it cannot read as is.
  function time(iso) {
    const el = document.createElement("time");
    el.dateTime = iso || "";
    // Date takes milliseconds: Python writes microseconds.
    const parsed = new Date(String(iso || "").replace(/(\.\d{3})\d+/, "$1"));
    el.textContent = iso && !isNaN(parsed) ? parsed.toISOString().slice(0, 19).replace("T", " ") + " UTC" : (iso || "");
    return el;
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
  return { open: open, bytes: bytes, time: time, applyDelta: applyDelta };
})();
