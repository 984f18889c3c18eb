"""llama-server's ``verbose`` request field on the OpenAI endpoints: ``verbose: true`` adds its
``__verbose`` object (the answer as /completion gives it, with the prompt the engine decoded)."""
from __future__ import annotations

import httpx
import pytest

from support.server import serving, tiny_chat_pair


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pair = tiny_chat_pair(tmp_path_factory.mktemp("verbose-server"))
    with serving(pair["ver"], pair["dft"], "-t", "1", "-c", "512", "-k", "4", "-n", "8") as s:
        yield s


def test_verbose_adds_llama_servers_debug_object(server):
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "best?"}]
    prompt = httpx.post(server.url + "/apply-template", json={"messages": messages},
                        timeout=60).json()["prompt"]
    for verbose in (True, False, None):
        body = {"messages": messages, "max_tokens": 3, "temperature": 0,
                **({} if verbose is None else {"verbose": verbose})}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()
        if not verbose:
            assert "__verbose" not in got
            continue
        v = got["__verbose"]
        # the prompt as decoded, as llama-server writes it: the BOS the tokenizer added first
        assert v["prompt"] == "<s> " + prompt
        assert v["content"] == got["choices"][0]["message"]["content"]
        assert v["tokens_predicted"] == got["usage"]["completion_tokens"] == 3
        assert v["tokens_evaluated"] == got["usage"]["prompt_tokens"]
        assert v["generation_settings"]["n_predict"] == 3 and v["timings"] == got["timings"]
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": messages, "verbose": "yes"}, timeout=60)
    assert r.status_code == 400


def test_serve_v_gives_every_answer_its_debug_object(tmp_path):
    """``serve -v`` is ``llama-server --verbose``: every OpenAI answer that is not streamed
    carries ``__verbose`` (what llama.cpp's prefill tests read), unless the request says
    ``verbose: false``."""
    pair = tiny_chat_pair(tmp_path)
    messages = [{"role": "user", "content": "best?"},
                {"role": "assistant", "content": "The"}]  # a prefill: continued, as rendered
    with serving(pair["ver"], pair["dft"], "-t", "1", "-c", "512", "-k", "4", "-v") as s:
        prompt = httpx.post(s.url + "/apply-template", json={"messages": messages},
                            timeout=60).json()["prompt"]
        for verbose, carried in ((None, True), (False, False)):
            body = {"messages": messages, "max_tokens": 2, "temperature": 0,
                    **({} if verbose is None else {"verbose": verbose})}
            got = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120).json()
            assert ("__verbose" in got) is carried
            if carried:
                assert got["__verbose"]["prompt"] == "<s> " + prompt and prompt.endswith("The")
