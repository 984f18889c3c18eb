"""``cactus-gguf serve`` on the real Qwen2.5-Coder pair: the openai client's greedy chat answer is
what ``cactus-gguf run --chat --temp 0`` prints, streaming gives the same text, and a chat's later
turns reuse the earlier ones' KV cache."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.harness import cli_env
from support.server import LiveServer, client

QUESTION = "Write a Python function that adds two numbers."


@pytest.fixture(scope="module")
def real_server(qwen_pair):
    ver, dft = qwen_pair
    with LiveServer(ver, dft, "-c", "2048", "-k", "4", "-t", "2") as s:
        yield s
    assert s.returncode == 0


def test_greedy_chat_equals_cactus_gguf_run_and_streams_the_same(real_server, qwen_pair):
    c = client(real_server)
    msg = [{"role": "user", "content": QUESTION}]
    r = c.chat.completions.create(model=c.models.list().data[0].id, messages=msg, max_tokens=48,
                                  temperature=0)
    ver, dft = qwen_pair
    run = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", str(ver), str(dft), "--chat",
                          "-p", QUESTION, "-n", "48", "--temp", "0", "-k", "4", "-c", "2048",
                          "-t", "2", "--json"], capture_output=True, text=True, env=cli_env(),
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert r.choices[0].message.content == json.loads(run.stdout)["text"]
    spec = r.model_extra["speculative"]
    assert spec["acceptance_rate"] > 0.5 and spec["acceptance_length"] > 1.0
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=r.model, messages=msg, max_tokens=48, temperature=0, stream=True) if ch.choices)
    assert streamed == r.choices[0].message.content


def test_a_chat_turn_reuses_the_previous_turns(real_server):
    c = client(real_server)
    model = c.models.list().data[0].id
    msg = [{"role": "user", "content": QUESTION}]
    first = c.chat.completions.create(model=model, messages=msg, max_tokens=32, temperature=0)
    msg += [{"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Now make it add three numbers."}]
    second = c.chat.completions.create(model=model, messages=msg, max_tokens=16, temperature=0)
    reused = second.model_extra["speculative"]["prompt_tokens_reused"]
    assert reused >= first.usage.prompt_tokens  # the first turn's prompt, at least
    assert second.usage.prompt_tokens_details.cached_tokens == reused


def test_response_format_json_schema_through_the_openai_client(real_server):
    """OpenAI's response_format (json_schema, then json_object) and llama-server's grammar field:
    valid output, streaming and not, speculation still accepting drafts."""
    import jsonschema

    schema = {"type": "object", "properties": {
        "city": {"type": "string"}, "population_millions": {"type": "number", "minimum": 0}},
        "required": ["city", "population_millions"], "additionalProperties": False}
    c = client(real_server)
    model = c.models.list().data[0].id
    msg = [{"role": "user", "content": "Give the largest city of Japan and its population as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    for seed in (1, 2):
        r = c.chat.completions.create(model=model, messages=msg, max_tokens=60, seed=seed,
                                      response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        assert r.model_extra["speculative"]["acceptance_rate"] > 0.3
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model=model, messages=msg, max_tokens=60, seed=seed, response_format=fmt,
            stream=True))
        assert streamed == r.choices[0].message.content
    r = c.chat.completions.create(model=model, messages=msg, max_tokens=60, seed=3,
                                  response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.completions.create(model=model, prompt="The answer (yes or no) is:", max_tokens=5,
                             extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert r.choices[0].text in (" yes", " no") and r.choices[0].finish_reason == "stop"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


def test_a_tool_call_round_trip_through_the_openai_client(real_server):
    """Call (tool_choice auto, streamed; required, not), tool result, answer: the real pair's own
    chat template renders the tools and the history, every call validates, speculation is on."""
    import jsonschema

    c = client(real_server)
    model = c.models.list().data[0].id
    msg = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]
    chunks = list(c.chat.completions.create(model=model, messages=msg, tools=[WEATHER],
                                            max_tokens=48, temperature=0, stream=True))
    calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and calls
    required = c.chat.completions.create(model=model, messages=msg, tools=[WEATHER],
                                         tool_choice="required", parallel_tool_calls=False,
                                         max_tokens=48, temperature=0)
    assert required.choices[0].finish_reason == "tool_calls"
    calls += required.choices[0].message.tool_calls
    for call in calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER["function"]["parameters"])
    assert required.model_extra["speculative"]["acceptance_rate"] > 0.3
    call = required.choices[0].message.tool_calls[0]
    msg += [required.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    answer = c.chat.completions.create(model=model, messages=msg, tools=[WEATHER],
                                       tool_choice="none", max_tokens=12, temperature=0)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content
    # the tools and the first turn stay the prompt's prefix: reused from the KV cache
    assert answer.usage.prompt_tokens_details.cached_tokens >= required.usage.prompt_tokens - 1


FIB_PREFIX, FIB_SUFFIX = "def fibonacci(n):\n    ", "\n\nprint(fibonacci(10))\n"


def test_infill_as_llama_vscode_sends_it_fills_the_gap(real_server):
    """llama.vscode's /infill request (src/llama-server.ts: createRequestPayload; a ring-buffer
    chunk in input_extra), sampled as it sends it (seed 0, top-k 40, top-p 0.99): what any sample
    satisfies (the answer's shape; n_indent 4 cuts before a line indented less, so every line
    after the first that has text is indented 4 or more). Its greedy answer (top-k 1, which CI's
    CPU kinds agree on; a sample differs between them: an AMX Xeon's left a docstring open) makes
    the file valid Python, with accepted drafts."""
    import ast

    import httpx

    body = {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX, "input_extra": [
        {"filename": "math_utils.py", "text": "def factorial(n):\n    if n < 2:\n        "
                                              "return 1\n    return n * factorial(n - 1)\n"}],
            "prompt": "", "n_predict": 48, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 60000, "n_indent": 4, "seed": 0}
    sampled = httpx.post(real_server.url + "/infill", json=body, timeout=600)
    assert sampled.status_code == 200, sampled.text
    a = sampled.json()
    assert isinstance(a["content"], str) and a["stop_type"] in ("eos", "limit")
    assert 0 <= a["tokens_predicted"] <= 48
    for line in a["content"].split("\n")[1:]:
        assert not line.strip() or len(line) - len(line.lstrip(" \t")) >= 4, a["content"]
    greedy = httpx.post(real_server.url + "/infill", json={**body, "top_k": 1},
                        timeout=600).json()
    assert greedy["content"].strip() and greedy["stop_type"] in ("eos", "limit")
    ast.parse(FIB_PREFIX + greedy["content"] + FIB_SUFFIX)
    assert greedy["timings"]["draft_n_accepted"] > 0


def test_completions_with_a_suffix_fill_the_gap(real_server):
    import ast

    c = client(real_server)
    prefix, suffix = "def is_even(n):\n    ", "\n\nassert is_even(4)\n"
    r = c.completions.create(model=c.models.list().data[0].id, prompt=prefix, suffix=suffix,
                             max_tokens=32, temperature=0)
    assert r.choices[0].finish_reason == "stop" and "%" in r.choices[0].text
    ast.parse(prefix + r.choices[0].text + suffix)


def test_a_tool_call_round_trip_through_the_responses_api(real_server):
    """The official openai client's Responses API on the real pair (issue 51): a function call,
    streamed and not (the same call), then its output sent back and answered in text;
    speculation runs."""
    import jsonschema

    c = client(real_server)
    tool = {"type": "function", **WEATHER["function"]}
    ask = "What is the weather in Paris right now, in celsius?"
    first = c.responses.create(model="m", input=ask, tools=[tool], tool_choice="required",
                               parallel_tool_calls=False, max_output_tokens=48, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    assert first.model_extra["speculative"]["acceptance_rate"] > 0.3
    events = list(c.responses.create(model="m", input=ask, tools=[tool], tool_choice="required",
                                     parallel_tool_calls=False, max_output_tokens=48,
                                     temperature=0, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(d.name, d.arguments) for d in done] == [(call.name, call.arguments)]
    assert events[-1].type == "response.completed"
    second = c.responses.create(
        model="m", tools=[tool], tool_choice="none", max_output_tokens=24, temperature=0,
        input=[{"role": "user", "content": ask},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": '{"temperature": 18}'}])
    assert [item.type for item in second.output] == ["message"] and second.output_text
    # the call and its output are in the prompt, after the first turn's
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_tool_call_round_trip_through_the_anthropic_messages_api(real_server):
    """The official anthropic client on the real pair (issue 51): a tool_use, streamed and not
    (the same call), then its tool_result sent back and answered in text."""
    import anthropic
    import jsonschema

    c = anthropic.Anthropic(base_url=real_server.url, api_key="none", max_retries=0,
                            timeout=300)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    ask = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]
    kw = dict(model="m", max_tokens=48, tools=[tool],
              tool_choice={"type": "any", "disable_parallel_tool_use": True},
              extra_body={"temperature": 0})
    first = c.messages.create(messages=ask, **kw)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(uses) == 1
    use = uses[0]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["function"]["parameters"])
    with c.messages.stream(messages=ask, **kw) as s:
        streamed = s.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
        [(use.name, use.input)]
    second = c.messages.create(
        model="m", max_tokens=24, tools=[tool], tool_choice={"type": "none"},
        extra_body={"temperature": 0},
        messages=[*ask, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": '{"temperature": 18}'}]}])
    assert [b.type for b in second.content] == ["text"] and second.content[0].text
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.usage.input_tokens > first.usage.input_tokens
