// The chat page of sessiongate: a client of the gateway's public API, nothing more.
//
// - Session: created with POST /v1/sessions (so typing hints have a session to refer to before the first turn),
//   remembered in sessionStorage with the API key, and restored from GET /v1/sessions/{id}/messages on reload.
// - Typing hints: POST /v1/sessions/{id}/typing {"state": "started"} on the first keystroke after idle (and again
//   every TYPING_REFRESH_MS while typing goes on, which keeps the advisory alive), {"state": "stopped"} when the
//   box is cleared, after TYPING_PAUSE_MS without a keystroke, or when the page goes away. Sending the message is
//   not "stopped": the turn itself takes the advisory.
// - Turns: POST /v1/chat/completions, streamed, with X-Session-Id; then GET /v1/sessions/{id}/turns for the
//   worker, cached tokens by tier and the advisory outcome of each turn (settled shortly after the turn ends, so
//   the table is read again a few times).
// Everything the server sends is shown with textContent, never as HTML.
"use strict";

(() => {
  // The advisor keeps a "stopped" advisory only a short grace (3 s by default) before cancelling it, so a pause
  // to reread the message before pressing Enter must not count as stopping: only a long one does.
  const TYPING_PAUSE_MS = 8000;
  // An advisory lives 30 s by default; a refresh well inside that keeps a long message's prefetch reserved.
  const TYPING_REFRESH_MS = 10000;
  // Outcomes are settled in the background after a turn ends: read the turns again after these delays.
  const TURN_REFRESH_DELAYS_MS = [0, 800, 2500, 6000];
  const STORE_KEY = "sessiongate.apiKey";
  const STORE_SESSION = "sessiongate.sessionId";
  const DASH = "\u2014";

  const $ = (id) => document.getElementById(id);
  const el = {
    sessionId: $("session-id"),
    newSession: $("new-session"),
    keyForm: $("key-form"),
    apiKey: $("api-key"),
    messages: $("messages"),
    composer: $("composer"),
    prompt: $("prompt"),
    model: $("model"),
    maxTokens: $("max-tokens"),
    temperature: $("temperature"),
    send: $("send"),
    status: $("status"),
    typingState: $("typing-state"),
    turns: document.querySelector("#turns tbody"),
    refresh: $("refresh"),
  };

  const state = {
    key: sessionStorage.getItem(STORE_KEY) || "",
    sessionId: null,
    messages: [], // the conversation sent with every turn: the chat API is stateless, the gateway records it
    busy: false,
    typing: false,
    lastStartedAt: 0,
    pauseTimer: null,
    refreshTimers: [],
    creating: null, // the POST /v1/sessions in flight, if any
  };

  // API

  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function headers(extra) {
    const h = { ...extra };
    if (state.key) h.Authorization = `Bearer ${state.key}`;
    return h;
  }

  async function errorOf(response) {
    let message = `${response.status} ${response.statusText}`;
    let code = null;
    try {
      const body = await response.json();
      if (body && body.error) {
        message = body.error.message || message;
        code = body.error.code || null;
      }
    } catch (_) {
      // not the OpenAI error format (a proxy's page): the status line says enough
    }
    return new ApiError(response.status, message, code);
  }

  async function api(method, path, body, options = {}) {
    const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
    if (body !== undefined) init.body = JSON.stringify(body);
    if (options.keepalive) init.keepalive = true;
    const response = await fetch(path, init);
    if (!response.ok) throw await errorOf(response);
    return response.status === 204 ? null : response.json();
  }

  const sessionPath = (suffix = "") => `v1/sessions/${encodeURIComponent(state.sessionId)}${suffix}`;

  // status line

  function setStatus(text, kind = "info") {
    el.status.textContent = text;
    el.status.dataset.kind = kind;
  }

  function explain(error) {
    if (error instanceof ApiError && error.status === 401) {
      return `${error.message} Enter this gateway's API key above.`;
    }
    return error.message || String(error);
  }

  // session

  function showSession() {
    el.sessionId.textContent = state.sessionId || DASH;
    document.body.dataset.session = state.sessionId || "";
  }

  async function newSession() {
    stopTyping();
    const created = await api("POST", "v1/sessions", {});
    state.sessionId = created.id;
    state.messages = [];
    sessionStorage.setItem(STORE_SESSION, state.sessionId);
    el.messages.replaceChildren();
    el.turns.replaceChildren();
    showSession();
  }

  async function restoreSession(sessionId) {
    state.sessionId = sessionId;
    try {
      const context = await api("GET", sessionPath("/messages"));
      state.messages = context.data.filter((m) => m.role === "user" || m.role === "assistant" || m.role === "system");
      el.messages.replaceChildren();
      for (const message of state.messages) addMessage(message.role, textOf(message.content));
      showSession();
      await refreshTurns();
      return true;
    } catch (error) {
      if (error instanceof ApiError && (error.status === 404 || error.status === 401)) {
        state.sessionId = null; // gone, or another tenant's: start a new one
        return false;
      }
      throw error;
    }
  }

  function ensureSession() {
    // One creation at a time: the first keystrokes and a quick Enter must not make a session each.
    if (state.sessionId) return Promise.resolve();
    state.creating = state.creating || newSession().finally(() => {
      state.creating = null;
    });
    return state.creating;
  }

  // models

  async function loadModels() {
    const models = await api("GET", "v1/models");
    const chosen = el.model.value;
    el.model.replaceChildren(new Option("(worker default)", ""));
    for (const model of models.data) el.model.add(new Option(model.id, model.id));
    el.model.value = models.data.some((m) => m.id === chosen) ? chosen : (models.data[0] || { id: "" }).id;
  }

  // typing hints

  function showTyping(label, value) {
    el.typingState.textContent = label;
    el.typingState.dataset.state = value;
  }

  async function sendTyping(value, options = {}) {
    if (!state.sessionId) return;
    try {
      const answer = await api("POST", sessionPath("/typing"), { state: value }, options);
      const counter = value === "started" ? "typingStarted" : "typingStopped";
      document.body.dataset[counter] = String(Number(document.body.dataset[counter] || 0) + 1);
      // An answer that comes after the user moved on (sent the message, typed again) describes the past.
      if (state.typing === (value === "started")) {
        showTyping(`${value === "started" ? "typing" : "not typing"} (hint: ${answer.state})`, value);
      }
    } catch (error) {
      // A hint is best effort: the turn works without it. Say so, and carry on.
      showTyping(`typing hint failed: ${explain(error)}`, "error");
    }
  }

  function startTyping() {
    const now = Date.now();
    if (state.typing && now - state.lastStartedAt < TYPING_REFRESH_MS) return;
    state.typing = true;
    state.lastStartedAt = now;
    sendTyping("started");
  }

  function stopTyping(options) {
    clearTimeout(state.pauseTimer);
    if (!state.typing) return;
    state.typing = false;
    sendTyping("stopped", options);
  }

  async function onInput() {
    clearTimeout(state.pauseTimer);
    if (el.prompt.value.trim() === "") {
      stopTyping();
      return;
    }
    try {
      await ensureSession();
    } catch (error) {
      setStatus(explain(error), "error");
      return;
    }
    startTyping();
    state.pauseTimer = setTimeout(() => stopTyping(), TYPING_PAUSE_MS);
  }

  // the conversation

  function textOf(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map((part) => part.text || "").join("");
    return "";
  }

  function addMessage(role, text) {
    const item = document.createElement("li");
    item.className = `message ${role}`;
    const who = document.createElement("span");
    who.className = "role";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    item.append(who, body);
    el.messages.append(item);
    item.scrollIntoView({ block: "end" });
    return item;
  }

  async function* sseData(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = block
          .split(/\r?\n/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (data) yield data;
      }
    }
  }

  async function send() {
    const text = el.prompt.value.trim();
    if (!text || state.busy) return;
    state.busy = true;
    document.body.dataset.busy = "true";
    el.send.disabled = true;
    clearTimeout(state.pauseTimer);
    state.typing = false; // the turn takes the advisory: no "stopped" for it
    showTyping("not typing", "idle");
    try {
      await ensureSession();
      el.prompt.value = "";
      const user = { role: "user", content: text };
      const asked = addMessage("user", text);
      const item = addMessage("assistant", "");
      item.classList.add("streaming");
      try {
        const answer = await streamTurn([...state.messages, user], item);
        state.messages.push(user, { role: "assistant", content: answer });
      } catch (error) {
        // The gateway recorded the turn as failed; the conversation goes on without it, and the message is back
        // in the box to send again.
        asked.classList.add("failed");
        item.classList.add("failed");
        if (!el.prompt.value) el.prompt.value = text;
        throw error;
      } finally {
        item.classList.remove("streaming");
      }
    } catch (error) {
      setStatus(explain(error), "error");
    } finally {
      state.busy = false;
      document.body.dataset.busy = "false";
      el.send.disabled = false;
      el.prompt.focus();
      scheduleTurnRefresh();
    }
  }

  async function streamTurn(messages, item) {
    const body = { messages, stream: true };
    if (el.model.value) body.model = el.model.value;
    const maxTokens = Number.parseInt(el.maxTokens.value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    const temperature = Number.parseFloat(el.temperature.value); // blank: the model's own sampling settings
    if (temperature >= 0) body.temperature = temperature;
    setStatus("waiting for the first token…");
    const response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", "X-Session-Id": state.sessionId }),
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      item.remove();
      throw await errorOf(response);
    }
    const worker = response.headers.get("x-sessiongate-worker") || "?";
    const target = item.querySelector(".text");
    let answer = "";
    let chunks = 0;
    let finish = null;
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(`The turn failed mid-way: ${chunk.error.message || "worker error"}`);
      for (const choice of chunk.choices || []) {
        const piece = (choice.delta && choice.delta.content) || "";
        if (piece) {
          answer += piece;
          chunks += 1;
          target.textContent = answer;
          item.dataset.chunks = String(chunks);
          setStatus(`streaming from ${worker}…`);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    item.dataset.worker = worker;
    item.dataset.done = "true";
    if (!answer) target.textContent = "(empty answer)";
    setStatus(`answered by ${worker}${finish ? ` (${finish})` : ""}`);
    return answer;
  }

  // the turns table

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined || text === "" ? DASH : String(text);
    if (className) td.className = className;
    return td;
  }

  function ttftMs(timings) {
    if (!timings || !timings.first_token_at || !timings.received_at) return null;
    return `${Math.round(Date.parse(timings.first_token_at) - Date.parse(timings.received_at))} ms`;
  }

  // Where a turn's resent history broke the session's cached prefix: "kind @ message index (~tokens lost)".
  function prefixBreakText(found) {
    if (!found) return DASH;
    return `${found.kind} @ ${found.index} (~${found.tokens_lost} tok)`;
  }

  function advisoryText(advisory) {
    if (!advisory) return DASH;
    return `${advisory.kind}: ${advisory.outcome || "pending"}`;
  }

  function renderTurns(turns) {
    const rows = turns.map((turn) => {
      const usage = turn.usage || {};
      const tiers = usage.cached_tokens_details || {};
      const row = document.createElement("tr");
      row.dataset.turnId = turn.id;
      row.dataset.status = turn.status;
      row.append(
        cell(turn.seq),
        cell(turn.status, `status ${turn.status}`),
        cell(turn.worker, "worker"),
        cell(usage.cached_tokens, "cached"),
        cell(tiers.device, "device"),
        cell(tiers.host, "host"),
        cell(tiers.storage, "storage"),
        cell(advisoryText(turn.advisory), "advisory"),
        cell(ttftMs(turn.timings), "ttft"),
        cell(prefixBreakText(turn.prefix_break), "prefix-break"),
      );
      if (turn.error) row.title = typeof turn.error === "string" ? turn.error : JSON.stringify(turn.error);
      return row;
    });
    el.turns.replaceChildren(...rows);
  }

  async function refreshTurns() {
    if (!state.sessionId) return;
    try {
      const turns = await api("GET", sessionPath("/turns"));
      renderTurns(turns.data);
    } catch (error) {
      setStatus(`Could not read the turns: ${explain(error)}`, "error");
    }
  }

  function scheduleTurnRefresh() {
    for (const timer of state.refreshTimers) clearTimeout(timer);
    state.refreshTimers = TURN_REFRESH_DELAYS_MS.map((delay) => setTimeout(refreshTurns, delay));
  }

  // start-up

  async function start() {
    el.apiKey.value = state.key;
    showSession();
    try {
      await loadModels();
      const previous = sessionStorage.getItem(STORE_SESSION);
      if (!(previous && (await restoreSession(previous)))) await newSession();
      setStatus("ready");
    } catch (error) {
      setStatus(explain(error), "error");
    }
    document.body.dataset.ready = "true";
  }

  el.keyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    stopTyping();
    state.key = el.apiKey.value.trim();
    if (state.key) sessionStorage.setItem(STORE_KEY, state.key);
    else sessionStorage.removeItem(STORE_KEY);
    // Sessions belong to a tenant: the session of the previous key is not this key's.
    state.sessionId = null;
    sessionStorage.removeItem(STORE_SESSION);
    el.messages.replaceChildren();
    el.turns.replaceChildren();
    await start();
  });

  el.newSession.addEventListener("click", async () => {
    try {
      await newSession();
      setStatus("new session");
    } catch (error) {
      setStatus(explain(error), "error");
    }
  });

  el.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  el.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  el.prompt.addEventListener("input", onInput);
  el.refresh.addEventListener("click", refreshTurns);
  // The user left: the message they were typing is not coming. keepalive lets the request outlive the page.
  window.addEventListener("pagehide", () => stopTyping({ keepalive: true }));

  start();
})();
