// Job rows: status and progress bars updated from the jobs socket.
// The list's first page (jobs.html) lists new jobs as they come; a page of older jobs (data-older,
// ?page=2...) only updates the rows it was loaded with; a job's own page (data-only), its one row.
"use strict";
(function () {
  const table = document.getElementById("jobs");
  const only = table.dataset.only;
  const older = table.dataset.older !== undefined;
  const fixed = Boolean(only) || older;  // no row is added or dropped
  const state = {};
  // Newest first, as the page lists them: a frame may bring several new jobs, in any key order.
  function insert(row) {
    const newer = Number(row.dataset.job);
    for (const other of table.tBodies[0].rows) {
      if (Number(other.dataset.job) < newer) { other.before(row); return; }
    }
    table.tBodies[0].appendChild(row);
  }
  // Cells are built as elements and text, never from HTML: nothing a frame carries is parsed as markup.
  function cell(...nodes) {
    const td = document.createElement("td");
    td.append(...nodes);
    return td;
  }
  function text(value) {
    const td = document.createElement("td");
    td.textContent = value;
    return td;
  }
  // A row for a job the page was not loaded with: its id, linked to its page; kind; status; progress.
  function newRow(id, job) {
    const row = document.createElement("tr");
    row.dataset.job = id;
    const link = document.createElement("a");
    link.href = "/jobs/" + encodeURIComponent(id) + "/";
    link.textContent = id;
    const status = text("");
    status.className = "status";
    const progress = document.createElement("progress");
    progress.max = 1;
    progress.setAttribute("aria-label", "progress of job " + id);
    const pct = document.createElement("span");
    pct.className = "pct";
    row.append(cell(link), text(job.kind), status, cell(progress, " ", pct), cell(Live.time(job.created)));
    return row;
  }
  // The list's "No jobs yet." row (jobs.html) while it has no job row, and only then.
  function showEmpty() {
    const empty = table.querySelector("tr.no-jobs");
    const any = table.querySelector("tr[data-job]") !== null;
    if (any && empty) empty.remove();
    if (!any && !empty) {
      const row = document.createElement("tr");
      row.className = "no-jobs";
      const td = text("No jobs yet.");
      td.colSpan = 5;
      td.className = "empty";
      row.appendChild(td);
      table.tBodies[0].appendChild(row);
    }
  }
  // The first page's "Older" link, once new jobs pushed listed ones to page 2: the stream is full
  // (it carries the newest data-shown jobs) and a row left it.
  function showOlder() {
    const pager = document.getElementById("jobs-pager");
    if (!pager || Object.keys(state).length < Number(table.dataset.shown)) return;
    pager.hidden = false;
    document.getElementById("older-jobs").hidden = false;
  }
  function update() {
    if (!fixed) {
      // A job that left the stream (no longer among the newest) would keep its last status forever.
      let dropped = false;
      for (const row of [...table.tBodies[0].rows]) {
        if (row.dataset.job && !(("job:" + row.dataset.job) in state)) { row.remove(); dropped = true; }
      }
      if (dropped) showOlder();
    }
    for (const [key, job] of Object.entries(state)) {
      const id = key.split(":")[1];
      if (only && id !== only) continue;
      let row = table.querySelector('tr[data-job="' + CSS.escape(id) + '"]');
      if (!row && !fixed) {
        row = newRow(id, job);
        insert(row);
      }
      if (!row) continue;
      const wasActive = row.dataset.status === "queued" || row.dataset.status === "running";
      row.dataset.status = job.status;
      // The list shows why a job failed in its row; the job's own page shows it once, below the row.
      row.querySelector(".status").textContent = job.status + (job.error && !only ? ": " + job.error : "");
      row.querySelector("progress").value = job.progress;
      row.querySelector(".pct").textContent = Math.round(job.progress * 100) + "%";
      if (only && wasActive && !(job.status === "queued" || job.status === "running")) {
        setTimeout(function () { location.reload(); }, 500);  // show the result
      }
    }
    if (!fixed) showEmpty();
  }
  Live.open(table.dataset.socket, function (message) {
    Live.applyDelta(state, message);
    update();
  });
})();
