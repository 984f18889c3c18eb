// The cactus-gguf chat page: streams replies from /v1/chat/completions (SSE), keeps the
// conversation, and colours each piece of text by where it came from (the "speculative"
// segments of each chunk: an accepted draft, or a token the verifier sampled).
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text || "";
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function appendSegments(div, segments) {
  for (const [text, source] of segments) {
    const span = document.createElement("span");
    span.className = source === "draft" ? "draft" : "verifier";
    span.dataset.source = source;
    span.textContent = text;
    div.appendChild(span);
  }
  $("log").scrollTop = $("log").scrollHeight;
}

function showStats(s) {
  const f = (x, d) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
  $("s-tps").textContent = f(s.tokens_per_second, 1);
  $("s-al").textContent = s.method === "none" ? "–" : f(s.acceptance_length, 2);
  $("s-acc").textContent = s.method === "none" ? "–" : (100 * s.acceptance_rate).toFixed(0) + "%";
  $("s-kl").textContent = s.method === "none" ? "–" : f(s.kl_mean, 3);
  $("s-okl").textContent = s.method === "none" ? "–" : f(s.output_kl_mean, 3);
  $("s-reused").textContent = s.prompt_tokens_reused;
}

// "auto" or a number; empty: not sent, so the server's own -k applies; anything else is sent
// as typed, so the server's 400 names the problem
function kValue(text) {
  const t = text.trim().toLowerCase();
  if (t === "") return undefined;
  if (t === "auto") return "auto";
  return !Number.isNaN(Number(t)) ? Number(t) : text;
}

function body() {
  const method = $("method").value;
  const spec = method === "none" ? false :
    { method, delta: Number($("delta").value), budget: $("budget").value,
      k: kValue($("k").value) };
  return { messages: history, stream: true, stream_options: { include_usage: true },
           temperature: Number($("temperature").value), max_tokens: Number($("max_tokens").value),
           speculative: spec };
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  $("send").disabled = true;
  const headers = { "Content-Type": "application/json" };
  if ($("api_key").value) headers.Authorization = "Bearer " + $("api_key").value;
  let reply = "";
  const started = performance.now();
  let tokens = 0;
  try {
    const res = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body()) });
    if (!res.ok) {
      const err = await res.json().catch(() => ({ error: { message: res.statusText } }));
      throw new Error(err.error.message);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0 || (cut = buffer.indexOf("\r\n\r\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + (buffer.startsWith("\r\n", cut) ? 4 : 2));
        for (const line of event.split(/\r?\n/)) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta && choice.delta.content) {
            reply += choice.delta.content;
            const segs = (chunk.speculative && chunk.speculative.segments) || [[choice.delta.content, "verifier"]];
            appendSegments(div, segs);
            tokens += segs.length;
            $("s-tps").textContent = (reply.length ? (tokens / ((performance.now() - started) / 1000)).toFixed(1) : "–");
          }
          if (choice && choice.finish_reason && chunk.speculative) showStats(chunk.speculative);
        }
      }
    }
    history.push({ role: "assistant", content: reply });
  } catch (e) {
    history.pop();
    div.remove();
    addMessage("error", "error: " + e.message);
  } finally {
    $("send").disabled = false;
    $("input").focus();
  }
}

$("ask").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || $("send").disabled) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("ask").requestSubmit(); }
});
$("clear").addEventListener("click", () => { history.length = 0; $("log").innerHTML = ""; });
fetch("/v1/models").then((r) => r.json()).then((m) => { $("model").textContent = m.data[0].id; })
  .catch(() => {});
