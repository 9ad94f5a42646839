// GPU map: host sections with one card per device, redrawn from the overview socket's deltas.
"use strict";
(function () {
  const root = document.getElementById("hosts");
  const state = JSON.parse(document.getElementById("overview-snapshot").textContent);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // "GPU 3", or "CPU 0" for a CPU host's one device (its host memory).
  function deviceName(card) {
    return (card.kind === "cpu" ? "CPU " : "GPU ") + card.index;
  }
  // The index of the device this card's device lends to, or null (as dashboard/snapshots.py
  // lends_to). A producer lends to its pair. A device that both lends and borrows reports itself
  // as a consumer with lent bytes: it lends to its pair when that is itself (a CPU host's engine
  // borrowing the host memory lent there) or a borrower that names it back; else the pair is its
  // own lender.
  function lendsTo(card, byIndex) {
    const peer = card.paired_with;
    if (peer === null || peer === undefined) return null;
    if (card.role === "producer" || (card.lent > 0 && peer === card.index)) return peer;
    const other = byIndex.get(peer);
    if (card.lent > 0 && other && other.borrowed > 0 && other.paired_with === card.index) return peer;
    return null;
  }
  // How ``card`` names the device at ``index`` of its host: "itself", or that device's name.
  function peerName(card, index, byIndex) {
    if (index === card.index) return "itself";
    const other = byIndex.get(index);
    return other ? deviceName(other) : "GPU " + index;
  }
  function selfLending(card) {
    return card.lent > 0 && card.borrowed > 0 && card.paired_with === card.index;
  }
  function bar(card) {
    const b = el("div", "membar");
    const total = card.total || 1;
    // A producer's "used" includes what it lent out (that memory is on this GPU): show the two
    // apart. A consumer's borrowed bytes live on its lender's GPU; they are drawn after its own
    // use (clipped by the bar) so the card shows how much extra room the engine has. A device
    // lending to its own engine holds what it borrows inside what it lent: that part is drawn
    // as borrowed, the rest of the lent memory as lent, so nothing is counted twice.
    const own = Math.max(card.used - card.lent, 0);
    let segs = [["used", own], ["lent", card.lent], ["borrowed", card.borrowed]];
    if (selfLending(card)) {
      const back = Math.min(card.borrowed, card.lent);
      segs = [["used", own], ["lent", card.lent - back], ["borrowed", back]];
    }
    for (const [cls, n] of segs) {
      const seg = el("span", "seg " + cls);
      seg.style.width = (100 * n / total).toFixed(2) + "%";
      seg.title = cls + " " + Live.bytes(n);
      b.appendChild(seg);
    }
    return b;
  }
  // "/models/0/" with the model's id: the model page of a deployment on a card.
  function modelUrl(id) {
    return root.dataset.modelUrl.replace(/\/0\/$/, "/" + id + "/");
  }
  // What is placed on the device: "tiny-llama #1 running" per deployment (its observed state),
  // linked to its model's page. A stopped deployment keeps its devices until it is deleted.
  function placed(card) {
    const list = el("ul", "placed");
    for (const d of card.deployments || []) {
      const li = el("li");
      li.dataset.deployment = d.id;
      const a = el("a", null, d.model);
      a.href = modelUrl(d.model_id);
      li.appendChild(a);
      li.appendChild(document.createTextNode(" #" + d.id + " "));
      li.appendChild(el("span", "badge state " + d.observed, d.observed));
      list.appendChild(li);
    }
    if (!list.childNodes.length) list.appendChild(el("li", "empty", "no deployment"));
    return list;
  }
  function render() {
    root.textContent = "";
    const hosts = Object.keys(state).filter((k) => k.startsWith("host:"))
      .sort((a, b) => state[a].name.localeCompare(state[b].name));
    if (!hosts.length) root.appendChild(el("p", "empty", "No hosts yet."));
    for (const hk of hosts) {
      const host = state[hk];
      const id = Number(hk.split(":")[1]);
      const section = el("section", "host");
      section.dataset.host = host.name;
      const h = el("h2", null, host.name + " ");
      const status = el("span", "badge status " + host.status, host.status);
      status.dataset.status = host.status;
      h.appendChild(status);
      if (host.simulated) h.appendChild(el("span", "badge simulated", "simulated"));
      section.appendChild(h);
      const cards = Object.keys(state).filter((k) => k.startsWith("device:") && state[k].host === id)
        .map((k) => [k, state[k]]).sort((a, b) => a[1].index - b[1].index);
      const byIndex = new Map(cards.map(([, c]) => [c.index, c]));
      const pairs = [];
      for (const [, c] of cards) {
        const to = lendsTo(c, byIndex);
        if (to === null) continue;
        pairs.push(deviceName(c) + " → " + peerName(c, to, byIndex));
      }
      section.appendChild(el("p", "pairings", pairs.length ? "Lending: " + pairs.join(", ") : "No lending."));
      const grid = el("div", "cards");
      for (const [key, c] of cards) {
        const card = el("div", "card role-" + c.role);
        card.dataset.device = key;
        card.dataset.role = c.role;
        card.dataset.ts = c.ts || "";
        card.appendChild(el("h3", null, deviceName(c) + " · " + c.name));
        // A consumer that also lends reports itself as a consumer: say it lends too.
        card.appendChild(el("span", "badge role", c.role === "consumer" && c.lent > 0 ? "consumer + producer" : c.role));
        card.appendChild(placed(c));
        card.appendChild(bar(c));
        // 0 bytes in all: a GPU whose memory NVML does not report (unified memory, as on a GB10).
        const used = el("p", "mem", c.total > 0 ? Live.bytes(c.used) + " used of " + Live.bytes(c.total) : "memory not reported");
        used.dataset.used = c.used;
        card.appendChild(used);
        const to = lendsTo(c, byIndex);
        const peer = c.paired_with === null ? "" : peerName(c, c.paired_with, byIndex);
        // paired_with names one side only: the borrower of a lender, else the lender of a borrower.
        if (c.lent) card.appendChild(el("p", "lent", "lent " + Live.bytes(c.lent) + (to !== null ? " to " + peer : "")));
        if (c.borrowed) card.appendChild(el("p", "borrowed", "borrowed " + Live.bytes(c.borrowed) + (peer && (to === null || to === c.index) ? " from " + peer : "")));
        if (c.utilization !== null) card.appendChild(el("p", "util", "util " + c.utilization.toFixed(0) + "%"));
        card.appendChild(el("p", "ts", c.ts ? "sample " + c.ts.slice(11, 19) : "no sample yet"));
        grid.appendChild(card);
      }
      section.appendChild(grid);
      root.appendChild(section);
    }
  }
  render();
  Live.open(root.dataset.socket, function (message) {
    Live.applyDelta(state, message);
    render();
  });
})();
