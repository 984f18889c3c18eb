"""llama-server's routes and fields on ``cactus-gguf serve`` (issue 51), on tiny GGUF models with
real HTTP clients: the routes without ``/v1``, ``/v1/health``, the token counts, bodies sent
without a JSON Content-Type, OpenAI answers with ``system_fingerprint`` and ``timings``, the first
chat chunk's ``content`` null, llama-server's error shapes (401, a prompt over the context), and
the Responses and Anthropic Messages APIs through the official ``openai`` and ``anthropic``
clients, tool calls included."""
from __future__ import annotations

import json

import httpx
import pytest

from support.harness import run_cli
from support.server import LiveServer, client, serving, sse_events
from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama
from support.tools import HERMES_TEMPLATE, SCHEMAS, TOOLS


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compat")
    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS],
                               chat_template=CHAT_TEMPLATE),
            "hermes": write_llama(d / "hermes.gguf", seed=11, zero_output_rows=[EOS],
                                  chat_template=HERMES_TEMPLATE)}


@pytest.fixture(scope="module")
def server(files):
    with serving(files["ver"], files["ver"], "-t", "1", "-c", "256", "-k", "4", "-n", "8",
                 "--temp", "0", "--metrics") as s:
        yield s


@pytest.fixture(scope="module")
def tool_server(files):
    with LiveServer(files["hermes"], files["hermes"], "-t", "1", "-c", "1024", "-k", "4",
                    "-n", "200", "--temp", "0.8") as s:
        yield s
    assert s.returncode == 0 and not any("Traceback" in ln for ln in s.stderr_lines), \
        s.stderr_lines


HELLO = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "seed": 1}


def post(server, path, body, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


def test_the_routes_without_v1_answer_as_those_with_it(server):
    with_v1 = post(server, "/v1/chat/completions", HELLO).json()
    without = post(server, "/chat/completions", HELLO).json()
    assert without["choices"][0]["message"] == with_v1["choices"][0]["message"]
    assert without["object"] == "chat.completion"
    models = httpx.get(server.url + "/models").json()
    assert models == httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"]
    assert httpx.get(server.url + "/v1/health").json() == {"status": "ok"}


def test_the_input_token_count_is_the_prompt_the_chat_decodes(server):
    counted = post(server, "/chat/completions/input_tokens", HELLO).json()
    answer = post(server, "/v1/chat/completions", HELLO).json()
    assert counted == {"input_tokens": answer["usage"]["prompt_tokens"]}
    assert post(server, "/v1/chat/completions/input_tokens", HELLO).json() == counted
    anthropic = post(server, "/v1/messages/count_tokens", HELLO).json()
    responses = post(server, "/v1/responses/input_tokens",
                     {"input": [{"role": "user", "content": "hello"}]}).json()
    assert anthropic == counted
    assert responses == {"object": "response.input_tokens", **counted}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          None])
def test_a_body_is_json_whatever_its_content_type(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"prompt": "hello", "n_predict": 3})
    r = httpx.post(server.url + "/completion", content=body, headers=headers, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 3
    r = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(HELLO),
                   headers=headers, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_openai_answers_carry_the_fingerprint_and_timings(server):
    r = post(server, "/v1/chat/completions", HELLO).json()
    assert r["system_fingerprint"].startswith("b")
    assert r["timings"]["predicted_n"] == r["usage"]["completion_tokens"] == 6
    assert r["timings"]["prompt_n"] + r["timings"]["cache_n"] == r["usage"]["prompt_tokens"]
    c = client(server)
    chunks = list(c.chat.completions.create(model="m", stream=True, **HELLO))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content is None  # llama-server's and OpenAI's null
    assert all(ch.system_fingerprint.startswith("b") for ch in chunks)
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 6


def test_a_prompt_over_the_context_is_llama_servers_error_on_every_route(server):
    long = "hello " * 400  # over -c 256
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
    e = r.json()["error"]
    assert r.status_code == 400 and e["type"] == "exceed_context_size_error"
    assert e["code"] == "context_length_exceeded" and e["n_ctx"] == 256
    assert e["n_prompt_tokens"] > 256
    r = post(server, "/completion", {"prompt": long})
    e = r.json()["error"]
    assert r.status_code == 400 and e["type"] == "exceed_context_size_error" and e["code"] == 400
    assert e["n_ctx"] == 256 and e["n_prompt_tokens"] > 256


def test_a_wrong_key_is_an_authentication_error_on_every_route(files):
    with LiveServer(files["ver"], "-t", "1", "--method", "none", "--api-key", "k3y",
                    "-n", "2") as s:
        for path in ("/v1/chat/completions", "/chat/completions", "/completion",
                     "/v1/messages", "/v1/responses"):
            r = post(s, path, HELLO)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(s.url + "/v1/health").status_code == 200  # public, as llama-server's
        assert httpx.get(s.url + "/models").status_code == 401
        ok = post(s, "/v1/chat/completions", HELLO, headers={"x-api-key": "k3y"})
        assert ok.status_code == 200


PREFLIGHT = {"Origin": "http://web.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "Authorization"}


def raw_headers(r: httpx.Response) -> dict[str, str]:
    """The response's headers as sent, names spelt as on the wire (a case-sensitive dict, as
    llama.cpp's server tests read them)."""
    return {k.decode(): v.decode() for k, v in r.headers.raw}


def test_cors_and_the_web_ui_files_as_llama_servers(files, server):
    """--cors-origin '*' answers as llama-server's any-origin CORS: the page's origin echoed with
    credentials allowed, its method list, any header; on the API key's 401 too. Header names are
    spelt as llama-server spells them. Its web UI's fixed files are public. Without
    --cors-origin (the fixture server) no CORS header is sent."""
    with serving(files["ver"], "-t", "1", "--method", "none", "-n", "2", "--api-key", "k3y",
                 "--cors-origin", "*") as s:
        r = httpx.options(s.url + "/completions", headers=PREFLIGHT)
        headers = raw_headers(r)
        assert r.status_code == 200, r.text
        assert headers["Access-Control-Allow-Origin"] == "http://web.example"
        assert headers["Access-Control-Allow-Credentials"] == "true"
        assert headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert headers["Access-Control-Allow-Headers"] == "*"
        refused = httpx.post(s.url + "/completion", json={"prompt": "a"},
                             headers={"Origin": "http://web.example"})
        headers = raw_headers(refused)
        assert refused.status_code == 401
        assert headers["Access-Control-Allow-Origin"] == "http://web.example"
        assert headers["Content-Type"] == "application/json"
        for path in ("/", "/sw.js", "/manifest.webmanifest", "/_app/version.json"):
            assert httpx.get(s.url + path).status_code == 200, path
        worker = httpx.get(s.url + "/sw.js")
        assert worker.headers["content-type"].startswith("application/javascript")
        assert "unregister()" in worker.text and worker.headers["cache-control"] == "no-cache"
        manifest = httpx.get(s.url + "/manifest.webmanifest")
        assert manifest.headers["content-type"].startswith("application/manifest+json")
        assert manifest.json()["start_url"] == "/"
        assert '<link rel="manifest" href="/manifest.webmanifest">' in httpx.get(s.url + "/").text
        props = httpx.get(s.url + "/props", headers={"Authorization": "Bearer k3y"}).json()
        assert httpx.get(s.url + "/_app/version.json").json() == {"version": props["build_info"]}
    r = httpx.options(server.url + "/completions", headers=PREFLIGHT)
    assert not any(k.lower().startswith("access-control-") for k in raw_headers(r))


# ---- the Responses API --------------------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def test_responses_text_streamed_and_not(server):
    c = client(server)
    r = c.responses.create(model="m", input="hello", max_output_tokens=6, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output_text
    assert r.usage.output_tokens == 6 and r.model_extra["speculative"]["method"] == "cactus"
    chat = post(server, "/v1/chat/completions", {**HELLO, "temperature": 0}).json()
    assert r.output_text == chat["choices"][0]["message"]["content"]
    events = list(c.responses.create(model="m", input="hello", max_output_tokens=6,
                                     temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # llama-server's last event whatever the finish; the response says why it stopped
    assert kinds[-1] == "response.completed" and "response.incomplete" not in kinds
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        r.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    with c.responses.stream(model="m", input="hello", max_output_tokens=6, temperature=0) as s:
        final = s.get_final_response()  # (the openai helper raises without response.completed)
    assert final.output_text == r.output_text and final.status == "incomplete"


def test_responses_refuse_what_llama_server_refuses(server):
    for body, param in (({"input": "hi", "previous_response_id": "resp_1"},
                         "previous_response_id"),
                        ({"input": [{"role": "user", "content": [
                            {"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
                        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type")):
        r = post(server, "/v1/responses", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_responses_tool_call_round_trip(tool_server):
    c = client(tool_server)
    first = c.responses.create(model="m", input="go", tools=RESPONSES_TOOLS,
                               tool_choice="required", parallel_tool_calls=False, extra_body={"seed": 1})
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1
    call = calls[0]
    assert json.loads(call.arguments).keys() <= SCHEMAS[call.name]["properties"].keys()
    streamed = list(c.responses.create(model="m", input="go", tools=RESPONSES_TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       extra_body={"seed": 1}, stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done"]
    assert [(d.name, d.arguments) for d in done] == [(call.name, call.arguments)]
    second = c.responses.create(
        model="m", tools=RESPONSES_TOOLS, tool_choice="none", max_output_tokens=5, extra_body={"seed": 1},
        input=[{"role": "user", "content": "go"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert [item.type for item in second.output] == ["message"] and second.output_text
    # the call and its result are in the prompt: more tokens than the first turn's
    assert second.usage.input_tokens > first.usage.input_tokens


# ---- the Anthropic Messages API ---------------------------------------------------------------

ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"],
                    **({"description": t["function"]["description"]}
                       if "description" in t["function"] else {})} for t in TOOLS]


def anthropic_client(server, **kw):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=kw.pop("api_key", "none"),
                               max_retries=0, timeout=120, **kw)


def test_anthropic_text_streamed_and_not(server):
    c = anthropic_client(server)
    m = c.messages.create(model="m", max_tokens=6, system="be brief",
                          messages=[{"role": "user", "content": "hello"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 6
    assert m.content[0].type == "text" and m.content[0].text
    with c.messages.stream(model="m", max_tokens=6, system="be brief",
                           messages=[{"role": "user", "content": "hello"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


def test_anthropic_stop_sequence_is_reported(server):
    c = anthropic_client(server)
    full = c.messages.create(model="m", max_tokens=8,
                             messages=[{"role": "user", "content": "hello"}]).content[0].text
    word = full[2:4]
    m = c.messages.create(model="m", max_tokens=8, stop_sequences=[word],
                          messages=[{"role": "user", "content": "hello"}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == full[:full.index(word)]


def test_anthropic_errors_are_anthropics_shape(server):
    import anthropic

    c = anthropic_client(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}])
    assert e.value.body["type"] == "error" and "messages.0.content.0" in \
        e.value.body["error"]["message"]
    r = post(server, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_empty_anthropic_messages_list_is_served(server):
    """As llama-server: the template renders the empty list (here: the assistant's turn opened),
    and the reply comes. OpenAI's chat body still needs a message (a 400)."""
    r = post(server, "/v1/messages", {"max_tokens": 3, "messages": []})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message" and r.json()["usage"]["output_tokens"] == 3
    count = post(server, "/v1/messages/count_tokens", {"messages": []}).json()["input_tokens"]
    assert count == len(post(server, "/tokenize", {"content": "assistant:",
                                                   "add_special": True}).json()["tokens"])
    r = post(server, "/v1/chat/completions", {"messages": [], "max_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_an_anthropic_tool_call_round_trip(tool_server):
    c = anthropic_client(tool_server)
    ask = [{"role": "user", "content": "go"}]
    first = c.messages.create(model="m", max_tokens=200, messages=ask, tools=ANTHROPIC_TOOLS,
                              tool_choice={"type": "any", "disable_parallel_tool_use": True},
                              metadata={"user_id": "u"}, extra_body={"seed": 1})
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(uses) == 1
    use = uses[0]
    assert use.input.keys() <= SCHEMAS[use.name]["properties"].keys()
    with c.messages.stream(model="m", max_tokens=200, messages=ask, tools=ANTHROPIC_TOOLS,
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           extra_body={"seed": 1}) as s:
        streamed = s.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
        [(use.name, use.input)]
    second = c.messages.create(model="m", max_tokens=5, tools=ANTHROPIC_TOOLS,
                               tool_choice={"type": "none"}, extra_body={"seed": 1},
                               messages=[*ask, {"role": "assistant", "content": first.content},
                                         {"role": "user", "content": [
                                             {"type": "tool_result", "tool_use_id": use.id,
                                              "content": "done"}]}])
    assert [b.type for b in second.content] == ["text"]
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_streamed_anthropic_reply_ends_with_its_events(server):
    with httpx.stream("POST", server.url + "/v1/messages", timeout=60, json={
            "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "hello"}]}) as r:
        data = [json.loads(d) for d in sse_events(r)]
    events = [d["type"] for d in data]
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    counted = post(server, "/v1/messages/count_tokens", {
        "messages": [{"role": "user", "content": "hello"}]}).json()["input_tokens"]
    assert data[0]["message"]["usage"]["input_tokens"] == counted > 0
    # thinking is accepted, as llama-server accepts it: no thinking block from this model
    m = post(server, "/v1/messages", {"max_tokens": 3, "thinking": {"type": "enabled",
                                                                    "budget_tokens": 50},
                                      "messages": [{"role": "user", "content": "2+2?"}]}).json()
    assert m["type"] == "message" and [b["type"] for b in m["content"]] == ["text"]


def test_a_small_batch_starts_with_k_auto_fitted_to_it():
    """``serve -b 16`` starts, as llama-server does: -k auto's default ceiling (16) is lowered to
    fit one llama_decode; a -k-max given that does not fit is still refused."""
    from cactus_gguf.errors import InputError
    from cactus_gguf.app.plan import plan_serve

    given = {"model": "v.gguf", "model_draft": "d.gguf", "n_batch": 16}
    request = plan_serve(given).run.request
    assert request.k == "auto" and request.k_max == 15
    assert plan_serve({**given, "n_batch": 512}).run.request.k_max == 16
    with pytest.raises(InputError, match="must be below"):
        plan_serve({**given, "k_max": 16})


# ---- /slots: the slot's prompt cache saved and restored ---------------------------------------

LONG = "the cat sat on the mat " * 12


@pytest.mark.parametrize("kind", ["llama", "lfm2"])
def test_a_slot_saved_and_restored_keeps_its_prompt_across_restarts(tmp_path, kind):
    """save / erase / restore of the slot's cache (KV cache, and the recurrent state of a hybrid
    model): after a restart, a request that continues the restored conversation reuses all of
    it instead of decoding it again."""
    from support.tiny_gguf import write_lfm2

    model = write_llama(tmp_path / "m.gguf", seed=11, zero_output_rows=[EOS]) if kind == "llama" \
        else write_lfm2(tmp_path / "m.gguf", seed=11)
    slots = tmp_path / "slots"
    args = (model, "-t", "1", "-c", "512", "--method", "none", "--slot-save-path", slots)
    ask = {"n_predict": 2, "seed": 1, "temperature": 0, "return_tokens": True}
    with LiveServer(*args) as s:
        ids = post(s, "/tokenize", {"content": LONG, "add_special": True}).json()["tokens"]
        first = post(s, "/completion", {"prompt": ids, **ask}).json()
        held = len(ids) + 1  # the prompt and the first token (the last one is never decoded)
        state = httpx.get(s.url + "/slots").json()
        assert state[0]["id"] == 0 and state[0]["n_prompt_tokens"] == held
        assert state[0]["is_processing"] is False
        saved = post(s, "/slots/0?action=save", {"filename": "chat.bin"}).json()
        assert saved["id_slot"] == 0 and saved["n_saved"] == held and saved["n_written"] > 0
        assert (slots / "chat.bin").stat().st_size == saved["n_written"]
        assert post(s, "/slots/0?action=erase", {}).json() == {"id_slot": 0, "n_erased": held}
        turn = ids + first["tokens"] + ids[1:6]  # the conversation goes on
        assert post(s, "/completion", {"prompt": turn, **ask}).json()["timings"]["cache_n"] == 0
        alone = post(s, "/completion", {"prompt": turn, **ask}).json()
    with LiveServer(*args) as s:  # a new process: nothing in its cache
        restored = post(s, "/slots/0?action=restore", {"filename": "chat.bin"}).json()
        assert restored["n_restored"] == held and restored["n_read"] == saved["n_written"]
        again = post(s, "/completion", {"prompt": turn, **ask}).json()
        assert again["timings"]["cache_n"] == held  # the restored cache: not decoded again
        assert again["tokens"] == alone["tokens"]
        for path, body, status in (("/slots/0?action=restore", {"filename": "../x"}, 400),
                                   ("/slots/0?action=restore", {"filename": "none.bin"}, 404),
                                   ("/slots/0?action=fly", {}, 400),
                                   ("/slots/3?action=erase", {}, 400)):
            r = post(s, path, body)
            assert r.status_code == status and r.json()["error"]["code"] == status, r.text
    with LiveServer(model, "-t", "1", "--method", "none", "--no-slots") as s:  # no save path
        r = post(s, "/slots/0?action=save", {"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
        r = httpx.get(s.url + "/slots")  # --no-slots: llama-server's 501
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_a_json_object_with_a_schema_follows_it(server):
    """llama-server's ``{"type": "json_object", "schema": ...}``: the answer is JSON of that
    schema (the tiny model's free choices stay inside the enum)."""
    schema = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
              "required": ["unit"], "additionalProperties": False}
    r = post(server, "/v1/chat/completions", {**HELLO, "max_tokens": 40, "response_format": {
        "type": "json_object", "schema": schema}}).json()
    assert json.loads(r["choices"][0]["message"]["content"]) in ({"unit": "c"}, {"unit": "f"})


def test_n_choices_and_several_prompts_each_get_their_answer(server):
    """``n`` > 1 and batched prompts: choice j of a prompt is the answer with the request's seed
    + j, so choice 0 is the n = 1 answer; usage adds up every choice."""
    one = post(server, "/v1/chat/completions", {**HELLO, "temperature": 1.0}).json()
    two = post(server, "/chat/completions", {**HELLO, "temperature": 1.0, "n": 2}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["message"] == one["choices"][0]["message"]
    seed2 = post(server, "/v1/chat/completions", {**HELLO, "temperature": 1.0,
                                                  "seed": HELLO["seed"] + 1}).json()
    assert two["choices"][1]["message"] == seed2["choices"][0]["message"]
    assert two["usage"]["completion_tokens"] == 12
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    c = client(server)
    batch = c.completions.create(model="m", prompt=["the cat", [3, 4, 5]], max_tokens=3, n=2,
                                 seed=1, temperature=0)
    assert [ch.index for ch in batch.choices] == [0, 1, 2, 3]
    alone = c.completions.create(model="m", prompt=[3, 4, 5], max_tokens=3, seed=1,
                                 temperature=0)
    assert batch.choices[2].text == alone.choices[0].text
    r = post(server, "/v1/chat/completions", {**HELLO, "n": 2, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = post(server, "/v1/completions", {"prompt": ["a", "b"], "suffix": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_completion_answers_each_prompt_of_a_batch(server):
    """llama-server's batched prompts on /completion: a JSON array, one answer per prompt (ids,
    text, ids mixed with text), each as the prompt alone gets it."""
    ids = post(server, "/tokenize", {"content": "the cat"}).json()["tokens"]
    ask = {"n_predict": 3, "temperature": 0, "seed": 1}
    batch = post(server, "/completion", {"prompt": [ids, "a dog", [ids[0], " sat"]], **ask})
    answers = batch.json()
    assert batch.status_code == 200 and [a["index"] for a in answers] == [0, 1, 2]
    for prompt, answer in zip((ids, "a dog", [ids[0], " sat"]), answers):
        assert answer["content"] == post(server, "/completion",
                                         {"prompt": prompt, **ask}).json()["content"]
    r = post(server, "/completion", {"prompt": ["a", "b"], "stream": True, **ask})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_llama_servers_small_behaviours(server, files):
    """From llama.cpp's own server tests: /metrics says when the process started, two assistant
    messages at the end are a 400, --no-ui answers 404 at /."""
    r = httpx.get(server.url + "/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 1_700_000_000
    # spelt as llama-server spells it: its tests read the headers as a case-sensitive dict
    assert b"Process-Start-Time-Unix" in [name for name, _ in r.headers.raw]
    two = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                        {"role": "assistant", "content": "b"}], "max_tokens": 2}
    r = post(server, "/v1/chat/completions", two)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "<!doctype html>" in httpx.get(server.url + "/").text
    with LiveServer(files["ver"], "-t", "1", "--method", "none", "--no-ui") as s:
        assert httpx.get(s.url + "/").status_code == 404
        for path in ("/manifest.webmanifest", "/_app/version.json"):
            assert httpx.get(s.url + path).status_code == 404, path
        # the worker that removes a kept llama-server UI's is served without a page too
        assert "unregister()" in httpx.get(s.url + "/sw.js").text


def test_a_chat_template_file_replaces_the_ggufs(files, tmp_path):
    """llama-server's --chat-template-file: chat prompts (and /apply-template) use it; a template
    that does not compile is refused before any model loads."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    with LiveServer(files["ver"], "-t", "1", "--method", "none", "-n", "2",
                    "--chat-template-file", template) as s:
        r = post(s, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
        assert r.json() == {"prompt": "<user>hi<assistant>"}
        assert httpx.get(s.url + "/props").json()["chat_template"] == template.read_text()
        assert post(s, "/v1/chat/completions", HELLO).status_code == 200
    template.write_text("{% for m in messages %}")
    r = run_cli("serve", files["ver"], "--method", "none", "--chat-template-file", template)
    assert r.returncode == 1 and "--chat-template-file is not a valid Jinja template" in r.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mapped(pid: int, path) -> bool:
    """Whether process ``pid`` has the file ``path`` mapped (llama.cpp maps a loaded GGUF)."""
    import os

    with open(f"/proc/{pid}/maps") as f:
        return os.path.realpath(path) in f.read()


def test_sleep_frees_the_models_and_the_next_request_loads_them(files):
    """llama-server's --sleep-idle-seconds: idle for 1 s, the models are freed (their file no
    longer mapped, /props is_sleeping); /health, /props, /v1/models and /metrics answer without
    waking them, and scrapes after the first read the same text; the next generation loads them again and
    answers the same tokens as before; /tokenize wakes them too."""
    import time

    def asleep(s, timeout=15.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if httpx.get(s.url + "/props").json()["is_sleeping"]:
                return True
            time.sleep(0.1)
        return False

    body = {"prompt": "hello", "n_predict": 6, "return_tokens": True}
    with serving(files["ver"], "-t", "1", "--method", "none", "--temp", "0",
                 "--sleep-idle-seconds", "1", "--metrics") as s:
        before = post(s, "/completion", body).json()["tokens"]
        assert len(before) == 6 and _mapped(s.pid, files["ver"])
        assert asleep(s) and not _mapped(s.pid, files["ver"])
        props = httpx.get(s.url + "/props").json()
        assert props["default_generation_settings"]["n_ctx"] > 0 and props["eos_token"] == "</s>"
        assert httpx.get(s.url + "/health").json() == {"status": "ok"}
        assert httpx.get(s.url + "/v1/models").status_code == 200
        # the first read ends the throughput window of the generation; then nothing changes
        scrapes = [httpx.get(s.url + "/metrics").text for _ in range(3)]
        assert "llamacpp:predicted_tokens_seconds 0.0" not in scrapes[0]
        assert scrapes[1] == scrapes[2] and "llamacpp:tokens_predicted_total 6.0" in scrapes[1]
        assert httpx.get(s.url + "/props").json()["is_sleeping"] is True
        assert post(s, "/completion", body).json()["tokens"] == before
        assert httpx.get(s.url + "/props").json()["is_sleeping"] is False
        assert _mapped(s.pid, files["ver"])
        assert asleep(s)
        assert post(s, "/tokenize", {"content": "hello"}).json()["tokens"]
        assert httpx.get(s.url + "/props").json()["is_sleeping"] is False
    r = run_cli("serve", files["ver"], "--method", "none", "--sleep-idle-seconds", "0")
    assert r.returncode == 1 and "--sleep-idle-seconds must be -1 or >= 1" in r.stderr, r.stderr


def test_llama_servers_serve_flags(files):
    """--host with two addresses (both answer, the key asked on both), --alias with several
    names (the first in sorted order is the id) and --tags on /v1/models, Vertex AI's
    AIP_MODE=PREDICTION (its port, /predict dispatching each instance to its route), and
    /metrics a 501 without --metrics, as llama-server."""
    import socket

    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
    port, gcp_port = _free_port(), _free_port()
    auth = {"Authorization": "Bearer k3y"}
    with serving(files["ver"], "-t", "1", "--method", "none", "-n", "4", "--api-key", "k3y",
                 "--host", "127.0.0.1,::1", "--alias", "tiny,code", "--tags", "chat, small",
                 port=port) as s:
        for host in ("127.0.0.1", "[::1]"):
            url = f"http://{host}:{port}"
            assert httpx.get(url + "/health").status_code == 200
            assert httpx.post(url + "/v1/completions", json={"prompt": "a"}).status_code == 401
            r = httpx.post(url + "/v1/completions", json={"prompt": "a"}, headers=auth)
            assert r.json()["usage"]["completion_tokens"] == 4
        model = httpx.get(s.url + "/v1/models", headers=auth).json()["data"]
        assert [(m["id"], m["aliases"], m["tags"]) for m in model] == \
            [("code", ["code", "tiny"], ["chat", "small"])]
        r = httpx.get(s.url + "/metrics", headers=auth)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    chat = {"@requestFormat": "chatCompletions", "max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with serving(files["ver"], "-t", "1", "--method", "none",
                 env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(gcp_port)}) as s:
        assert s.url == f"http://127.0.0.1:{gcp_port}"  # (not --port 0's)
        r = post(s, "/predict", {"instances": [chat, {"@requestFormat": "/tokenize",
                                                      "content": "hi"}, {"@requestFormat": "x"}]})
        one, two, three = r.json()["predictions"]
        assert one["usage"]["completion_tokens"] == 3 and one["object"] == "chat.completion"
        assert two == post(s, "/tokenize", {"content": "hi"}).json()
        assert three["error"]["code"] == 400 and "'x'" in three["error"]["message"]
        assert post(s, "/predict", {"instances": {}}).status_code == 400
    r = run_cli("serve", files["ver"], "--method", "none", "--host", "127.0.0.1,::1", "--port", "0")
    assert r.returncode == 1 and "--host names several addresses: they share one port" in \
        r.stderr, r.stderr
