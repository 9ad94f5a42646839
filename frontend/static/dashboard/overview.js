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
  function bar(card) {
    const b = el("div", "membar");
    const total = card.total || 1;
    // A producer's "used" includes what it lent out (that memory is on this GPU): show the two
    // apart. A consumer's borrowed bytes live on its lender's GPU; they are drawn after its own
    // use (clipped by the bar) so the card shows how much extra room the engine has.
    const own = Math.max(card.used - card.lent, 0);
    for (const [cls, n] of [["used", own], ["lent", card.lent], ["borrowed", card.borrowed]]) {
      const seg = el("span", "seg " + cls);
      seg.style.width = (100 * n / total).toFixed(2) + "%";
      seg.title = cls + " " + Live.bytes(n);
      b.appendChild(seg);
    }
    return b;
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
      const pairs = cards.filter(([, c]) => c.role === "producer" && c.paired_with !== null)
        .map(([, c]) => "GPU " + c.index + " → GPU " + c.paired_with);
      section.appendChild(el("p", "pairings", pairs.length ? "Lending: " + pairs.join(", ") : "No lending."));
      const grid = el("div", "cards");
      for (const [key, c] of cards) {
        const card = el("div", "card role-" + c.role);
        card.dataset.device = key;
        card.dataset.role = c.role;
        card.dataset.ts = c.ts || "";
        card.appendChild(el("h3", null, "GPU " + c.index + " · " + c.name));
        card.appendChild(el("span", "badge role", c.role));
        card.appendChild(bar(c));
        const used = el("p", "mem", Live.bytes(c.used) + " used of " + Live.bytes(c.total));
        used.dataset.used = c.used;
        card.appendChild(used);
        if (c.lent) card.appendChild(el("p", "lent", "lent " + Live.bytes(c.lent) + (c.paired_with !== null ? " to GPU " + c.paired_with : "")));
        if (c.borrowed) card.appendChild(el("p", "borrowed", "borrowed " + Live.bytes(c.borrowed) + (c.paired_with !== null ? " from GPU " + c.paired_with : "")));
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
