"""One check of a request's speculation options for the CLI, the server and the engine
(options/speculation.py; issue 52 item 7), answers that report what ran and can be sent back
(``"inf"``), and ``-v`` kept to cactus-gguf's own lines."""
from __future__ import annotations

import json
import logging
import math

import httpx
import pytest

from cactus_gguf.errors import InputError
from support.rule import NAMES
from support.server import LiveServer
from support.tiny_gguf import write_qwen35


def _flags(pair, server_flags: dict) -> dict:
    """The options of ``serve`` (and ``run``) by name: the verifier, and the draft where
    ``server_flags`` has ``model_draft`` (True)."""
    out = {"model": str(pair[0]), **server_flags}
    if out.get("model_draft"):
        out["model_draft"] = str(pair[1])
    return out


def _cli_param(pair, server_flags: dict, speculative: dict) -> str | None:
    """The option ``cactus-gguf run`` refuses (its plan, before loading) with the server's flags
    and the request's fields on its command line; None when it accepts them."""
    from cactus_gguf.app import plan

    try:
        plan.plan_run({**_flags(pair, server_flags), **speculative, "prompt": "x"})
    except InputError as e:
        return e.param
    return None


def _server_request(pair, server_flags: dict, speculative: dict):
    """(the Request, None) the server makes of a chat body with ``speculative``, or (None, the
    InputError's param and message) when it refuses it."""
    from cactus_gguf.app import plan
    from cactus_gguf.server.schemas import ChatCompletionRequest, to_request

    base = plan.plan_serve(_flags(pair, server_flags)).run.request
    body = ChatCompletionRequest.model_validate(json.loads(json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "speculative": speculative})))
    try:
        return to_request(base, body), None
    except InputError as e:
        return None, (e.param, str(e))


MTP, NGRAM, PAIR = {"drafter": "mtp"}, {"drafter": "ngram"}, {"model_draft": True}  # servers
COMBINATIONS = [  # (server flags, the request's speculative object, the option refused or None)
    (MTP, {"drafter": "mtp", "draft_vocab": "text"}, "draft_vocab"),  # was a 200 reporting same
    (MTP, {"draft_window": 8}, "draft_window"),  # was dropped, reported null
    (MTP, {"drafter": "mtp", "draft_vocab": "auto"}, None),  # the default says nothing
    (MTP, {"draft_window": 0, "k": 3}, None),
    (NGRAM, {"draft_vocab": "map"}, "draft_vocab"),
    (NGRAM, {"drafter": "ngram", "draft_window": 16}, "draft_window"),
    (PAIR, {"drafter": "hybrid", "draft_window": 16, "draft_vocab": "same"}, None),
    (PAIR, {"draft_vocab": "text", "draft_window": 4}, "draft_window"),  # the Request's own rule
]


@pytest.mark.parametrize("flags,speculative,refused", COMBINATIONS,
                         ids=[json.dumps(s) for _, s, _ in COMBINATIONS])
def test_the_cli_and_the_server_refuse_the_same_combinations(tiny_pair, flags, speculative,
                                                             refused):
    assert _cli_param(tiny_pair, flags, speculative) == refused
    request, error = _server_request(tiny_pair, flags, speculative)
    if refused is None:
        assert error is None and all(getattr(request, k) == v for k, v in speculative.items())
    else:  # named as the client wrote it
        assert request is None and error[0] == f"speculative.{refused}", error
        assert error[1].startswith(f"speculative.{refused} "), error


def test_a_draft_models_option_with_the_mtp_drafter_is_refused_in_the_servers_words(tiny_pair):
    _, error = _server_request(tiny_pair, MTP, {"drafter": "mtp", "draft_vocab": "text"})
    assert error == ("speculative.draft_vocab",
                     "speculative.draft_vocab applies to a draft model, and the mtp drafter uses "
                     "none: drop speculative.draft_vocab, or use speculative.drafter model")


@pytest.mark.parametrize("word", ["inf", "INF", "Infinity", "infinity", "+inf"])
def test_a_float_setting_takes_the_string_inf_as_answers_write_it(tiny_pair, word):
    request, error = _server_request(tiny_pair, PAIR, {"top_gap": word, "delta": word,
                                                       "ears_alpha": word})
    assert error is None and request.top_gap == request.delta == request.ears_alpha == math.inf


def test_inf_out_of_range_and_other_strings_are_still_refused(tiny_pair):
    _, error = _server_request(tiny_pair, PAIR, {"draft_p_min": "inf"})
    assert error == ("speculative.draft_p_min",
                     "speculative.draft_p_min must be in [0, 1], got inf")
    from pydantic import ValidationError

    from cactus_gguf.server.speculative import Speculative

    for bad in ("0.5", "infinite", "nan", ""):
        with pytest.raises(ValidationError):
            Speculative(top_gap=bad)


@pytest.mark.parametrize("flags,speculative", [
    (PAIR, {"top_gap": "inf", "protect_ends": "off"}),
    (PAIR, {"method": "ears", "ears_alpha": 0.25, "k": 3}),
    (PAIR, {"drafter": "ngram", "ngram_max": 4}),
    (MTP, {"k": "auto", "k_max": 6, "delta": 2}),
    (PAIR, {"k": 0}),
])
def test_what_an_answer_reports_is_sendable_back(tiny_pair, flags, speculative):
    """The rule an answer reports (options/rule.py rule_of, as JSON) sent back as the request's
    speculative object runs the same rule."""
    from cactus_gguf.options.rule import rule_of

    request, error = _server_request(tiny_pair, flags, speculative)
    assert error is None, error
    reported = json.loads(json.dumps(rule_of(request), allow_nan=False))
    again, error = _server_request(tiny_pair, flags,
                                   {k: v for k, v in reported.items() if v is not None})
    assert error is None, error
    assert rule_of(again) == rule_of(request)


def test_an_engine_without_a_draft_model_names_the_drafter_and_what_it_runs(tiny_pair):
    from support.harness import make_engine

    with make_engine(tiny_pair[0], method="none", temp=0.0) as eng:
        assert eng.drafters == ("ngram",)
        with pytest.raises(InputError) as e:
            eng.generate("the cat", n_predict=2, method="sps", drafter="hybrid")
        assert e.value.param == "drafter"
        assert str(e.value) == ("drafter hybrid needs a draft model, and none is loaded: the "
                                "models loaded here run drafter ngram, or method none")
        r = eng.generate("the cat sat on the cat", n_predict=4, method="sps", drafter="ngram")
        assert r.stats.draft_vocab is None


@pytest.fixture(scope="module")
def mtp_server(tmp_path_factory):
    path = write_qwen35(tmp_path_factory.mktemp("mtp_opts") / "mimic.gguf", seed=11, n_nextn=1,
                        mimic=0.3)
    with LiveServer(path, "--drafter", "mtp", "-k", "4", "-c", "256", "-t", "1") as s:
        yield s
    assert s.returncode == 0, s.stderr_lines


def _complete(server, speculative) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "the cat sat on", "max_tokens": 8, "seed": 1, "speculative": speculative})


def test_an_mtp_server_refuses_what_run_refuses_and_reports_what_ran(mtp_server):
    for speculative, param, words in [
            ({"drafter": "mtp", "draft_vocab": "text"}, "speculative.draft_vocab",
             "speculative.draft_vocab applies to a draft model, and the mtp drafter uses none"),
            ({"draft_window": 8}, "speculative.draft_window",
             "speculative.draft_window applies to a draft model, and the mtp drafter uses none"),
            ({"drafter": "hybrid"}, "speculative.drafter",
             "speculative.drafter hybrid needs a draft model, and none is loaded: the models "
             "loaded here run speculative.drafter ngram or mtp, or speculative.method none")]:
        r = _complete(mtp_server, speculative)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(words), err
    r = _complete(mtp_server, {"top_gap": "inf", "draft_vocab": "auto"})
    assert r.status_code == 200, r.text
    block = r.json()["speculative"]
    assert (block["drafter"], block["top_gap"], block["draft_vocab"], block["draft_window"]) == \
        ("mtp", "inf", None, None)
    rule = {k: block[k] for k in NAMES}
    back = _complete(mtp_server, {k: v for k, v in rule.items() if v is not None})
    assert back.status_code == 200, back.text
    assert {k: back.json()["speculative"][k] for k in NAMES} == rule


def test_verbose_keeps_the_file_locks_lines_out(tmp_path, caplog):
    """-v printed filelock's acquire / release lines (its logger at DEBUG)."""
    import filelock

    from cactus_gguf.cli.group import configure_logging

    root = logging.getLogger()
    loggers = [logging.getLogger(n) for n in ("filelock", "asyncio", "cactus_gguf.llama_cpp")]
    saved = root.level, list(root.handlers), [lg.level for lg in loggers]
    try:
        configure_logging(1)
        caplog.set_level(logging.DEBUG)  # the root logger (-v's level), not filelock's
        with filelock.FileLock(tmp_path / "x.lock"):
            logging.getLogger("cactus_gguf.test").debug("a decision")
        assert [r.name for r in caplog.records] == ["cactus_gguf.test"]
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for lg, level in zip(loggers, saved[2]):
            lg.setLevel(level)
