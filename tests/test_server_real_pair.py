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
