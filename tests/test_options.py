"""The one options schema: every front end derives from cactus_gguf/options/, so nothing can drift.

- the flag tables of docs/options.md are exactly what ``python -m cactus_gguf.options`` prints
  (``python docs/generate.py`` rewrites them);
- every click option of ``run`` / ``bench`` has the schema's default (``--help`` shows it);
- the API records' defaults are the schema's; a pair's recommendation applies once, the same way,
  for run and bench; library messages name options by API name, the CLI by flag.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cactus_gguf import options
from cactus_gguf.errors import InputError

OPTIONS_DOC = Path(__file__).resolve().parent.parent / "docs" / "options.md"


@pytest.mark.parametrize("command", ["run", "bench", "serve"])
def test_the_docs_flag_table_matches_the_schema(command):
    text = OPTIONS_DOC.read_text(encoding="utf-8")
    m = re.search(rf"<!-- options:{command}[^>]*-->\n(.*?)<!-- /options:{command} -->", text, re.S)
    assert m, f"docs/options.md has no generated {command} table"
    assert m.group(1) == options.markdown_table(command), (
        f"docs/options.md's {command} table is stale: regenerate it with python docs/generate.py")


@pytest.mark.parametrize("command", ["run", "bench"])
def test_click_defaults_are_the_schema_defaults(command):
    from cactus_gguf.cli import main

    cmd = main.commands[command]
    by_name = {p.name: p for p in cmd.params}
    for o in options.options_in(command=command):
        if not any(f.startswith("-") for f in o.flags):
            continue
        p = by_name[o.name]
        want = o.default_for(command)
        if command == "bench" and o.grid and want is not None:
            want = ",".join(map(str, want)) if isinstance(want, tuple) else want
        assert p.default == (list(want) if o.multiple else want) or (
            o.multiple and p.default in ((), None, [])), o.name
        assert [f for f in o.flags if f.startswith("-")] == p.opts + p.secondary_opts or o.optional


def test_api_records_take_their_defaults_from_the_schema():
    from cactus_gguf.llama import ContextOptions, ModelOptions
    from cactus_gguf.sampling import AcceptanceParams, SamplingParams

    r, lo = options.Request(), options.LoadOptions()
    for name in ("temperature", "top_k", "top_p", "min_p"):
        assert getattr(SamplingParams(), name) == getattr(r, name) == options.default(name)
    for name in ("method", "delta", "solver", "typical_epsilon", "typical_alpha", "accept_top_k"):
        assert getattr(AcceptanceParams(), name) == getattr(r, name) == options.default(name)
    for name in ("n_ctx", "n_batch", "n_threads", "flash_attn"):
        assert getattr(ContextOptions(), name) == getattr(lo, name) == options.default(name)
    assert ModelOptions().n_gpu_layers == lo.n_gpu_layers
    for record in (SamplingParams, AcceptanceParams, ContextOptions):  # declared with opt(name)
        for f in dataclasses.fields(record):
            o = options.option_of(f)
            assert o is None and f.name in ("end_tau", "end_mask", "n_rs_seq", "mtp") \
                or o is options.BY_NAME[f.name]


@pytest.mark.parametrize("cls, scope", [(options.Request, "request"),
                                        (options.LoadOptions, "load")])
def test_each_option_of_a_scope_is_a_field_of_its_record_and_nothing_else_is(cls, scope):
    fields = dataclasses.fields(cls)
    # both ways, in table order (a field added on one side only fails)
    assert [f.name for f in fields] == [o.name for o in options.options_in(scope)]
    made = cls()
    for f in fields:
        o = options.option_of(f)
        assert o is options.BY_NAME[f.name], f.name  # the field carries its own Option
        assert f.default == (tuple(o.default) if o.multiple else o.default), f.name
        assert getattr(made, f.name) == f.default, f.name
        assert o.type.__name__ in str(f.type), (f.name, f.type)  # the annotation names the type
    assert cls._SCOPE == scope


def test_records_refuse_unknown_names_and_validate_each_field():
    with pytest.raises(InputError) as e:
        options.Request(deltaa=1.0)
    assert (str(e.value), e.value.param) == ("unknown request option 'deltaa'", "deltaa")
    with pytest.raises(InputError) as e:
        options.LoadOptions().replace(n_ctxx=4)
    assert (str(e.value), e.value.param) == ("unknown load option 'n_ctxx'", "n_ctxx")
    with pytest.raises(TypeError):
        options.Request(128)  # keyword-only, as the option names are the API
    with pytest.raises(InputError) as e:
        options.Request().replace(delta=-1.0)
    assert e.value.param == "delta"
    assert options.Request(stop="END").stop == ("END",)
    assert options.Request(stop=["a", "b"]).stop == ("a", "b")
    assert options.Request(stop=None).stop == ()
    assert options.Request(json_schema={"type": "object"}).json_schema == '{"type":"object"}'
    r = options.Request(json_object=True).replace(grammar='root ::= "x"')
    assert (r.json_object, r.grammar) == (False, 'root ::= "x"')  # one constraint replaces another


def test_k_zero_and_method_none_do_not_speculate():
    assert options.Request().speculates and options.Request(k="auto", method="sps").speculates
    assert not options.Request(k=0).speculates  # as llama.cpp's --draft-max 0
    assert not options.Request(method="none", k=4).speculates
    options.validate_pairing(options.LoadOptions(n_batch=1), options.Request(k=0))


def test_a_pair_recommendation_applies_to_run_and_bench_alike():
    from cactus_gguf.app.plan import settle
    from cactus_gguf.registry import load_registry

    pair = load_registry().default_pair
    run, bench = settle({}, pair, "run"), settle({}, pair, "bench")
    for name, value in pair.settings.items():
        assert options.BY_NAME[name].recommend
        assert run[name] == value
        # bench's own grid default (delta 0.5,1,2) is not narrowed to the pair's single value
        assert bench[name] == options.BY_NAME[name].command_defaults.get("bench", value)
    assert bench["delta"] == (0.5, 1.0, 2.0) and bench["k"] == pair.settings["k"]
    assert run["min_p"] == bench["min_p"] == 0.0  # the paper's sampling: no min-p
    assert settle({"top_k": 7}, pair, "run")["top_k"] == 7  # what the user sets wins


def test_messages_name_options_by_api_name_and_by_flag_on_the_command_line():
    from cactus_gguf.cli.params import flag_of

    with pytest.raises(InputError) as e:
        options.Request(top_p=0.0)
    assert str(e.value) == "top_p must be in (0, 1] (1 = off), got 0"
    assert e.value.param == "top_p"
    assert e.value.render(flag_of) == "--top-p must be in (0, 1] (1 = off), got 0"
    with pytest.raises(InputError) as e:
        options.validate_pairing(options.LoadOptions(n_batch=4), options.Request(k=4))
    assert e.value.render(flag_of).startswith("-k/--draft-max=4 must be below -b/--batch-size=4")


def test_each_option_is_declared_once():
    names = [o.name for o in options.OPTIONS]
    assert len(names) == len(set(names))
    for command in ("run", "bench", "serve"):
        flags = [f for o in options.options_in(command=command) for f in o.flags
                 if f.startswith("-")]
        assert len(flags) == len(set(flags)), command


def test_options_that_share_a_flag_share_a_meaning():
    """One flag, one option, in every command (serve's --timeout is a request's seconds; bench's
    seconds per test run are --test-timeout)."""
    owners: dict[str, set[str]] = {}
    for o in options.OPTIONS:
        for f in o.flags:
            owners.setdefault(f, set()).add(o.name)
    assert {f: n for f, n in owners.items() if len(n) > 1} == {}


# ---- issue 42: combinations and values refused before anything loads ------------------------------

def _cli(*args: str):
    """``cactus-gguf ARGS`` in process: (exit code, output)."""
    from click.testing import CliRunner

    from cactus_gguf.cli import main

    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def _one_line_error(args, fragment: str) -> None:
    code, out = _cli(*args)
    assert code == 1 and out.count("\n") == 1, (args, out)
    assert out.startswith("cactus-gguf: error: ") and fragment in out, (args, out)


def test_list_devices_validates_the_options_as_any_run():
    """`run --top-gap -1 --list-devices` exited 0: --list-devices skipped every check."""
    _one_line_error(["run", "--top-gap", "-1", "--list-devices"], "--top-gap must be >= 0, got -1")
    _one_line_error(["serve", "--port", "70000", "--list-devices"], "--port must be in")
    _one_line_error(["bench", "--configs", "bogus", "--list-devices"], "unknown configuration")
    _one_line_error(["run", "-ts", "1e400", "--list-devices"], "finite")
    code, out = _cli("run", "--list-devices")  # the default pair's options: valid, nothing loads
    assert code == 0 and "verifier" in out and "devices:" in out, out


def test_a_tensor_split_must_be_finite_and_have_something_to_split(tiny_pair):
    from cactus_gguf.llama import devices, log

    with pytest.raises(InputError, match=r"tensor_split needs finite proportions .* got inf"):
        options.LoadOptions(tensor_split="1e400")  # was "not all 0"
    with pytest.raises(InputError, match="got nan"):
        options.LoadOptions(tensor_split="1,nan")
    ver = str(tiny_pair[0])
    _one_line_error(["run", ver, "--method", "none", "-p", "x", "-ts", "3,1", "-ngl", "0"],
                    "-ts/--tensor-split splits the verifier's offloaded layers between devices, "
                    "and -ngl/--n-gpu-layers 0 offloads none")
    log.init_backend()
    if [name for name, _ in devices.list_devices()] != ["CPU"]:
        pytest.skip("this build has an offload device: -ts applies")
    _one_line_error(["run", ver, "--method", "none", "-p", "x", "-ts", "3,1"],
                    "this llama.cpp build has none to offload to (CPU only, no --rpc")


def test_a_draft_models_option_with_a_drafter_that_uses_none_is_refused(tiny_pair):
    """`--drafter ngram --draft-vocab text` was silently ignored."""
    ver = str(tiny_pair[0])
    for command in ("run", "serve"):
        _one_line_error([command, ver, "--drafter", "ngram", "--draft-vocab", "text", "-p", "x"]
                        [:None if command == "run" else -2],
                        "--draft-vocab applies to a draft model, and the ngram drafter uses none: "
                        "drop --draft-vocab, or use --drafter model")
    _one_line_error(["run", ver, "--drafter", "mtp", "--draft-window", "8", "-p", "x"],
                    "--draft-window applies to a draft model")
    from cactus_gguf.app import plan

    # the default (auto) says nothing: allowed
    assert plan.plan_run({"model": ver, "drafter": "ngram", "draft_vocab": "auto",
                          "prompt": "x"}).request.drafter == "ngram"


def test_naming_a_pairs_two_models_gets_the_pairs_settings():
    """`run VERIFIER_NAME DRAFT_NAME` of the default pair got temperature 0.8 and pair null."""
    from cactus_gguf import registry
    from cactus_gguf.app import plan

    pair = registry.load_registry().default_pair
    default = plan.plan_run({"prompt": "x"})
    named = plan.plan_run({"model": pair.verifier, "model_draft": pair.draft, "prompt": "x"})
    assert named.pair_name == default.pair_name == pair.name
    assert named.request == default.request
    assert named.request.temperature == pair.settings["temperature"] != options.default(
        "temperature")
    assert plan.plan_serve({"model": pair.verifier, "model_draft": pair.draft}).model_id == \
        pair.name
    # an option the user sets still wins; one model named, or the two the other way: no pair
    assert plan.plan_run({"model": pair.verifier, "model_draft": pair.draft, "prompt": "x",
                          "temperature": 0.3}).request.temperature == 0.3
    assert plan.plan_run({"model": pair.verifier, "method": "none",
                          "prompt": "x"}).pair_name is None
    assert plan.plan_run({"model": pair.draft, "model_draft": pair.verifier,
                          "prompt": "x"}).pair_name is None
    with pytest.raises(InputError, match="drafter uses no draft model: drop DRAFT"):
        plan.plan_run({"model": pair.verifier, "model_draft": pair.draft, "drafter": "ngram",
                       "prompt": "x"})


def test_a_stop_list_with_a_non_string_names_the_item():
    from cactus_gguf.options import Request

    with pytest.raises(InputError, match=r"^stop must be a string or a list of strings, got None "
                                         r"in the list$"):
        Request(stop=["a", None])
