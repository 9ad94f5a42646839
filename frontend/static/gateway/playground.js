// Chat playground: streams /v1/chat/completions with fetch() and a ReadableStream over the SSE
// response, appending each token as it arrives. "Stop" aborts the fetch: the gateway sees the
// disconnect and the engine aborts the generation.
"use strict";

(function () {
  const form = document.getElementById("playground");
  if (!form) return;
  const $ = (id) => document.getElementById(id);
  const transcript = $("pg-transcript"), input = $("pg-input"), stats = $("pg-stats"), errorBox = $("pg-error");
  const sendButton = $("pg-send"), stopButton = $("pg-stop");
  let history = [];  // [{role, content}] of this conversation
  let apiKey = null;
  let controller = null;

  function csrfToken() {
    const field = form.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  async function key() {
    if (apiKey) return apiKey;
    const response = await fetch(form.dataset.keyUrl, {
      method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() },
    });
    if (!response.ok) throw new Error(`could not get a playground key (HTTP ${response.status})`);
    apiKey = (await response.json()).key;
    return apiKey;
  }

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = `msg ${role}`;
    div.textContent = text;
    transcript.appendChild(div);
    transcript.scrollTop = transcript.scrollHeight;
    return div;
  }

  // Splits the byte stream into SSE events; calls onData(payload) for each "data:" line.
  async function readEvents(body, onData) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data:")) onData(line.slice(5).trim());
        }
      }
    }
  }

  async function send(text) {
    errorBox.textContent = "";
    history.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    controller = new AbortController();
    sendButton.disabled = true;
    stopButton.disabled = false;
    const started = performance.now();
    let firstAt = null, tokens = 0, usage = null;
    try {
      const response = await fetch(`${form.dataset.api}/chat/completions`, {
        method: "POST",
        signal: controller.signal,
        headers: { "Content-Type": "application/json", "Authorization": `Bearer ${await key()}` },
        body: JSON.stringify({
          model: $("pg-model").value,
          messages: history,
          max_tokens: Number($("pg-max-tokens").value),
          temperature: Number($("pg-temperature").value),
          stream: true,
          stream_options: { include_usage: true },
        }),
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        if (response.status === 401) apiKey = null;  // revoked: get a new one next time
        throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
      }
      await readEvents(response.body, (data) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const piece = (choice.delta && choice.delta.content) || "";
          if (!piece) continue;
          if (firstAt === null) firstAt = performance.now();
          tokens += 1;
          out.textContent += piece;
          transcript.scrollTop = transcript.scrollHeight;
        }
        const ttft = firstAt === null ? "–" : `${Math.round(firstAt - started)} ms`;
        stats.textContent = `first token ${ttft} · ${tokens} chunks` +
          (usage ? ` · ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens` : "");
      });
    } catch (err) {
      if (err.name !== "AbortError") errorBox.textContent = String(err.message || err);
      else stats.textContent += " · stopped";
    } finally {
      history.push({ role: "assistant", content: out.textContent });
      controller = null;
      sendButton.disabled = false;
      stopButton.disabled = true;
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || controller) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  stopButton.addEventListener("click", () => { if (controller) controller.abort(); });
  $("pg-clear").addEventListener("click", () => {
    if (controller) controller.abort();
    history = [];
    transcript.textContent = "";
    stats.textContent = "";
  });
})();
