// Chat playground: streams /v1/chat/completions with fetch() and a ReadableStream over the SSE
// response, appending each token as it arrives. "Stop" aborts the fetch: the gateway sees the
// disconnect and the engine aborts the generation.
//
// `history` is what the transcript shows and what the model is sent: a turn joins it when its
// reply ends or is stopped (with the text shown). A turn that fails (an error answer, an error
// event mid-reply, a stream cut off before [DONE]) leaves the transcript, and its text goes back
// into the input box so that Send retries it.
"use strict";

(function () {
  const form = document.getElementById("playground");
  if (!form) return;
  const $ = (id) => document.getElementById(id);
  const transcript = $("pg-transcript"), input = $("pg-input"), stats = $("pg-stats"), errorBox = $("pg-error");
  const sendButton = $("pg-send"), stopButton = $("pg-stop");
  let history = [];  // [{role, content}] of this conversation, oldest first
  let apiKey = null;
  let turn = null;  // the reply in flight: {controller, discarded}
  let follow = true;  // keep the transcript scrolled to its end; false once the reader scrolls up
  let pinnedTop = 0;  // scrollTop where following last put it
  let scrollQueued = false;

  function csrfToken() {
    const field = form.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  async function key() {
    if (apiKey) return apiKey;
    const response = await fetch(form.dataset.keyUrl, {
      method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() },
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.detail || `Could not get a playground key (HTTP ${response.status}).`);
    apiKey = body.key;
    return apiKey;
  }

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = `msg ${role}`;
    div.textContent = text;
    transcript.appendChild(div);
    return div;
  }

  function atEnd() {
    return transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 4;
  }

  // At most one scroll a frame, however many chunks arrive in it (each would force a layout).
  function scrollToEnd() {
    if (!follow || scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      if (!follow) return;
      transcript.scrollTop = transcript.scrollHeight;
      pinnedTop = transcript.scrollTop;
    });
  }

  transcript.addEventListener("scroll", () => {
    // Our own scroll's event may arrive after more text made the end move away: only a move up
    // from where following put the view means the reader wants to stay there.
    if (atEnd()) follow = true;
    else if (transcript.scrollTop < pinnedTop) follow = false;
  });

  function setBusy(busy) {
    sendButton.disabled = busy;
    stopButton.disabled = !busy;
  }

  // The error an answer other than 200 stands for, with when to retry if the gateway said.
  async function answerError(response) {
    const body = await response.json().catch(() => ({}));
    const message = body.error && typeof body.error.message === "string" && body.error.message;
    let text = message || `The gateway answered HTTP ${response.status}.`;
    const wait = response.headers.get("Retry-After");
    if (wait && /^\d+$/.test(wait.trim())) text += ` Retry in ${wait.trim()} s.`;
    return new Error(text);
  }

  async function post(body, signal) {
    const attempt = async () => fetch(`${form.dataset.api}/chat/completions`, {
      method: "POST",
      signal,
      headers: { "Content-Type": "application/json", "Authorization": `Bearer ${await key()}` },
      body: JSON.stringify(body),
    });
    let response = await attempt();
    if (response.status === 401) {  // the key was revoked (or retired by a newer session): once more
      apiKey = null;
      response = await attempt();
    }
    if (!response.ok) throw await answerError(response);
    return response;
  }

  // Splits the byte stream into SSE events; calls onData(payload) for each "data:" line. The
  // decoder keeps a character cut between two chunks until its last byte arrives.
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
    stats.textContent = "";
    const messages = [...history, { role: "user", content: text }];
    const asked = bubble("user", text);
    const out = bubble("assistant", "");
    const reply = out.appendChild(document.createTextNode(""));  // appendData: no re-copy per token
    const current = turn = { controller: new AbortController(), discarded: false };
    follow = true;
    scrollToEnd();
    setBusy(true);
    const started = performance.now();
    let firstAt = null, chunks = 0, usage = null, finish = null, finished = false, failure = null;
    try {
      const response = await post({
        model: $("pg-model").value,
        messages,
        max_tokens: Number($("pg-max-tokens").value),
        temperature: Number($("pg-temperature").value),
        stream: true,
        stream_options: { include_usage: true },
      }, current.controller.signal);
      await readEvents(response.body, (data) => {
        if (data === "[DONE]") { finished = true; return; }
        let chunk;
        try { chunk = JSON.parse(data); } catch (err) { throw new Error("The gateway sent a malformed event."); }
        if (chunk.error) {  // the engine failed mid-reply (the gateway's last event)
          const message = typeof chunk.error.message === "string" && chunk.error.message;
          throw new Error(message || "The engine failed mid-reply.");
        }
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          if (choice.finish_reason) finish = choice.finish_reason;
          const piece = (choice.delta && choice.delta.content) || "";
          if (!piece) continue;
          if (firstAt === null) firstAt = performance.now();
          chunks += 1;
          reply.appendData(piece);
          scrollToEnd();
        }
        const ttft = firstAt === null ? "–" : `${Math.round(firstAt - started)} ms`;
        stats.textContent = `first token ${ttft} · ${chunks} chunks` +
          (usage ? ` · ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens` : "");
      });
      if (!finished) throw new Error("The reply was cut off: the stream ended before the model finished.");
    } catch (err) {
      if (err.name !== "AbortError") failure = err;
    }
    if (current.discarded) return;  // "New chat" was pressed: this turn belongs to no conversation
    current.controller.abort();  // after an error event: close the connection (no-op if it ended)
    turn = null;
    setBusy(false);
    if (failure) {
      asked.remove();
      out.remove();
      errorBox.textContent = String(failure.message || failure);
      if (!input.value.trim()) input.value = text;
      return;
    }
    history.push({ role: "user", content: text }, { role: "assistant", content: reply.data });
    if (!finished) stats.textContent += " · stopped";
    else if (finish === "length") stats.textContent += " · stopped at the max tokens";
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || turn) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (event) => {
    // Enter that confirms an input method's composition (Japanese, Chinese...) is not a send.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener("click", () => { if (turn) turn.controller.abort(); });
  $("pg-clear").addEventListener("click", () => {
    if (turn) {
      turn.discarded = true;
      turn.controller.abort();
      turn = null;
      setBusy(false);
    }
    history = [];
    transcript.textContent = "";
    stats.textContent = "";
    errorBox.textContent = "";
  });
})();
