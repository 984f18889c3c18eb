"""Record the golden token ids of tests/golden/cases.py on this machine:

    python tests/golden/record.py            # writes tests/golden/golden.json (merging entries)
                                             # and tests/golden/native.json (machine-independent)

Floating-point results depend on llama.cpp's CPU kernels, so the ids are stored under what picks
them (golden_run.kernel_key: CPU features, repacking, threads); tests/test_golden.py compares
against the entry of the machine it runs on.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from cases import NATIVE_CASES, REAL_CASES, REAL_PROMPTS, TINY_CASES, TINY_PROMPTS  # noqa: E402
from golden_run import engine_key, generate_ids, load_pair, native_steps  # noqa: E402


def main() -> None:
    from support.tiny_gguf import write_llama
    import tempfile

    out = HERE / "golden.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    with tempfile.TemporaryDirectory() as d:
        tiny = (write_llama(Path(d) / "verifier.gguf", seed=11, logit_scale=2.0),
                write_llama(Path(d) / "draft.gguf", seed=11, logit_scale=2.0, noise=0.5,
                           noise_seed=12))
        sets = {"tiny": (tiny, TINY_CASES, TINY_PROMPTS)}
        if "--tiny-only" not in sys.argv:
            from cactus_gguf import registry
            real = (registry.pull_model("qwen2.5-coder-1.5b-instruct-q4_k_m"),
                    registry.pull_model("qwen2.5-coder-0.5b-instruct-q4_k_m"))
            sets["real"] = (real, REAL_CASES, REAL_PROMPTS)
        for set_name, (paths, cases, prompts) in sets.items():
            with load_pair(*paths, n_ctx=512 if set_name == "tiny" else 1024) as engine:
                key = engine_key(engine)
                ids = {name: generate_ids(engine, prompts[c["prompt"]], c) for name, c in cases}
            data.setdefault(key, {})[set_name] = ids
            print(f"{set_name}: {len(ids)} cases recorded for {key!r}")
    out.write_text(dump(data))
    native = {name: native_steps(acc) for name, acc in NATIVE_CASES}
    (HERE / "native.json").write_text(
        "{\n" + ",\n".join(f"  {json.dumps(n)}: {json.dumps(v)}" for n, v in native.items()) + "\n}\n")
    print(f"native: {len(native)} cases recorded")


def dump(data: dict) -> str:
    """One case per line: {kernel key: {set: {case: [ids]}}}."""
    lines = ["{"]
    for i, (key, sets) in enumerate(sorted(data.items())):
        lines.append(f"{json.dumps(key)}: {{")
        for j, (set_name, cases) in enumerate(sorted(sets.items())):
            lines.append(f"  {json.dumps(set_name)}: {{")
            items = sorted(cases.items())
            lines += [f"    {json.dumps(name)}: {json.dumps(ids)}" + ("," if n < len(items) - 1 else "")
                      for n, (name, ids) in enumerate(items)]
            lines.append("  }" + ("," if j < len(sets) - 1 else ""))
        lines.append("}" + ("," if i < len(data) - 1 else ""))
    return "\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    main()
