// The chat page of ds4-server (docs/SERVER.md, Chat page). Each turn sends the whole
// conversation to POST /v1/chat/completions with stream: true (the server reuses the KV cache of
// the prefix it has already seen) and shows the stream as it comes: the text, the reasoning in a
// collapsed "Thinking" block, tool calls as blocks with their name and arguments. Stop aborts the
// fetch; the server sees the connection close and stops generating.
//
// Model and user text reach the page only as text nodes (textContent, append of a string), never
// as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

// The conversation as it is resent, and the last request body (tests/server/test_chat_page.py
// replays it without streaming and compares the answers).
const state = { messages: [], controller: null, lastRequest: null };
window.ds4chat = state;

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Settings survive a reload: the API key for this tab only (sessionStorage), the rest in
// localStorage.
const SAVED = ["system", "temperature", "max-tokens", "thinking"];

function loadSettings() {
  for (const id of SAVED) {
    const v = localStorage.getItem("ds4chat." + id);
    if (v === null) continue;
    if ($(id).type === "checkbox") $(id).checked = v === "1";
    else $(id).value = v;
  }
  $("api-key").value = sessionStorage.getItem("ds4chat.api-key") || "";
}

function saveSettings() {
  for (const id of SAVED) {
    const v = $(id).type === "checkbox" ? ($(id).checked ? "1" : "0") : $(id).value;
    localStorage.setItem("ds4chat." + id, v);
  }
  sessionStorage.setItem("ds4chat.api-key", $("api-key").value);
}

// The page loads without a key; its API calls carry the one entered, if any.
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function requestBody() {
  const messages = [];
  const system = $("system").value;
  if (system.trim()) messages.push({ role: "system", content: system });
  messages.push(...state.messages);
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  const temperature = parseFloat($("temperature").value);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  body.thinking = { type: $("thinking").checked ? "enabled" : "disabled" };
  return body;
}

function scrollDown() {
  $("log").scrollTop = $("log").scrollHeight;
}

function addMessage(role, text) {
  const m = el("div", "msg " + role);
  m.append(el("div", "role", role === "user" ? "You" : "Assistant"), el("div", "content", text));
  $("log").append(m);
  scrollDown();
  return m;
}

// The view of one assistant answer as it streams, and the message it adds to the conversation.
class AnswerView {
  constructor() {
    this.m = addMessage("assistant", "");
    this.m.dataset.state = "streaming";
    this.contentEl = this.m.querySelector(".content");
    this.meta = el("div", "meta", "generating");
    this.m.append(this.meta);
    this.content = "";
    this.reasoning = "";
    this.thinkingText = null;
    this.calls = [];  // by the stream's index: {data, nameEl, argsEl}
  }

  addReasoning(text) {
    if (!this.thinkingText) {
      const d = el("details", "thinking");
      d.append(el("summary", null, "Thinking"));
      this.thinkingText = el("div", "text");
      d.append(this.thinkingText);
      this.m.insertBefore(d, this.contentEl);
    }
    this.reasoning += text;
    this.thinkingText.append(text);  // a text node
    scrollDown();
  }

  addContent(text) {
    this.content += text;
    this.contentEl.append(text);  // a text node
    scrollDown();
  }

  // A delta.tool_calls entry: the first one of a call has its id and name, the later ones pieces
  // of its arguments.
  addToolCall(tc) {
    let c = this.calls[tc.index];
    if (!c) {
      const box = el("div", "tool-call");
      c = { data: { id: "", type: "function", function: { name: "", arguments: "" } },
            nameEl: el("div", "name", "tool call"), argsEl: el("pre", "args") };
      box.append(c.nameEl, c.argsEl);
      this.m.insertBefore(box, this.meta);
      this.calls[tc.index] = c;
    }
    if (tc.id) c.data.id = tc.id;
    const fn = tc.function || {};
    if (fn.name) {
      c.data.function.name += fn.name;
      c.nameEl.textContent = "tool call: " + c.data.function.name;
    }
    if (fn.arguments) {
      c.data.function.arguments += fn.arguments;
      c.argsEl.append(fn.arguments);  // a text node
    }
    scrollDown();
  }

  showError(message) {
    this.m.append(el("div", "error", message));
  }

  finish(stateName, text) {
    this.m.dataset.state = stateName;
    this.meta.textContent = text;
  }

  // What the next turn resends; null when nothing came. A call cut before its name is dropped:
  // the server refuses a call without one.
  message() {
    const calls = this.calls.filter((c) => c && c.data.function.name).map((c) => c.data);
    if (!this.content && !this.reasoning && !calls.length) return null;
    const msg = { role: "assistant", content: this.content };
    if (this.reasoning) msg.reasoning_content = this.reasoning;
    if (calls.length) msg.tool_calls = calls;
    return msg;
  }
}

// The events of an SSE body: {event, data}, comments (`: keep-alive`) skipped. ds4-server ends
// its lines with \n only.
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "event") event = v;
          else if (field === "data") data.push(v);
        }
        if (data.length) yield { event, data: data.join("\n") };
      }
    }
  } finally {
    // A consumer that stops early ([DONE], an error event) lets go of the body.
    reader.cancel().catch(() => {});
  }
}

// The message of an error answer: OpenAI's {"error":{"message"}} when it is JSON.
async function errorText(res) {
  const text = await res.text();
  try {
    const j = JSON.parse(text);
    if (j.error && j.error.message) return `${res.status}: ${j.error.message}`;
  } catch (_) {
    // not JSON: the text as it is
  }
  return `${res.status}: ${text || res.statusText}`;
}

function summary(finish, usage, seconds) {
  let s = "finish " + finish;
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    s += ` · ${usage.completion_tokens} tokens in ${seconds.toFixed(1)} s`;
    s += ` · prompt ${usage.prompt_tokens} tokens (${cached} cached)`;
  }
  return s;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("status").textContent = busy ? "generating" : "";
}

// Removes a turn's user message from its conversation (the turn produced nothing to keep).
function takeBack(conversation, userMsg) {
  const i = conversation.lastIndexOf(userMsg);
  if (i >= 0) conversation.splice(i, 1);
}

async function send() {
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  $("prompt").value = "";
  // This turn's conversation: after New chat, a late answer lands in the old one, not the new.
  const conversation = state.messages;
  const userMsg = { role: "user", content: text };
  conversation.push(userMsg);
  const userEl = addMessage("user", text);
  const view = new AnswerView();
  const body = requestBody();
  state.lastRequest = body;
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const started = performance.now();
  try {
    // Relative, so that the page also works behind a proxy that serves it under a prefix.
    const res = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    let finish = null, usage = null;
    for await (const ev of sseEvents(res.body)) {
      if (ev.data === "[DONE]") break;
      const j = JSON.parse(ev.data);
      if (ev.event === "error" || j.error)
        throw new Error((j.error && j.error.message) || "the stream failed");
      if (j.usage) usage = j.usage;
      const choice = (j.choices || [])[0];
      if (!choice) continue;
      const d = choice.delta || {};
      if (d.reasoning_content) view.addReasoning(d.reasoning_content);
      if (d.content) view.addContent(d.content);
      for (const tc of d.tool_calls || []) view.addToolCall(tc);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    if (!finish) throw new Error("the stream ended without a finish reason");
    view.m.dataset.finish = finish;
    view.finish("done", summary(finish, usage, (performance.now() - started) / 1000));
    const msg = view.message();
    if (msg) conversation.push(msg);
  } catch (e) {
    if (controller.signal.aborted) {
      // What came stays in the conversation: it is what the user saw. Stopped before anything
      // came, the turn is taken back, so that the next one does not send two user messages.
      view.finish("stopped", "stopped");
      const msg = view.message();
      if (msg) {
        conversation.push(msg);
      } else {
        userEl.classList.add("failed");
        takeBack(conversation, userMsg);
        if (!$("prompt").value && conversation === state.messages) $("prompt").value = text;
      }
    } else {
      // The turn is taken back, so that sending again does not repeat the user message.
      view.finish("error", "error");
      view.showError(e.message || String(e));
      userEl.classList.add("failed");
      takeBack(conversation, userMsg);
      if (!$("prompt").value) $("prompt").value = text;
    }
  } finally {
    // New chat may have started another turn meanwhile: that one's state is not ours to reset.
    if (state.controller === controller) {
      state.controller = null;
      setBusy(false);
    }
  }
}

function stop() {
  if (state.controller) state.controller.abort();
}

function newChat() {
  stop();
  // Ready at once: the aborted turn settles into its own (old) conversation.
  state.controller = null;
  setBusy(false);
  state.messages = [];
  $("log").replaceChildren();
}

async function showModel() {
  try {
    const res = await fetch("health");  // needs no key
    const h = await res.json();
    $("model").textContent = `${h.model} · ${h.slots.total} slot${h.slots.total === 1 ? "" : "s"}`;
  } catch (_) {
    $("model").textContent = "server not answering";
  }
}

loadSettings();
for (const id of [...SAVED, "api-key"]) $(id).addEventListener("change", saveSettings);
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
showModel();
