"use strict";
(function () {
  const pre = document.getElementById("log-tail");
  Live.open(pre.dataset.socket, function (message) {
    if (message.type === "log") {
      pre.textContent = message.lines.length ? message.lines.join("\n") : "(the log is empty)";
    }
  });
})();
