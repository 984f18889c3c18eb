"""The greedy rule (llama-server's: accept while the verifier's own sample equals the draft)
leaves the verifier's random numbers to the verifier (issue 51 item 6): the drafts draw from their
own stream, and every emitted token takes one uniform of the verifier's, so a seed gives the
verifier alone's tokens with or without a draft, at any temperature. The other rules cannot: SpS
and Cactus spend a uniform on each acceptance test and one on the residual, so the same seed
follows another path (SpS's law is still the verifier's, docs/maths.md)."""
from __future__ import annotations

import numpy as np
import pytest

from support.harness import make_engine

from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling.rng import Rng


@pytest.mark.parametrize("temp", [0.2, 0.8, 1.0])
def test_greedy_with_a_draft_gives_the_verifier_alones_tokens(tiny_pair, temp):
    ver, dft = tiny_pair
    alone = make_engine(ver, temp=temp, method="none")
    drafted = make_engine(ver, dft, temp=temp, method="greedy", k=4)
    try:
        for seed in range(6):
            want = alone.generate("the cat", n_predict=24, seed=seed).tokens
            got = drafted.generate("the cat", n_predict=24, seed=seed)
            assert got.tokens == want, seed
            assert got.stats.n_drafted > 0  # the draft ran
        # the draft does change what the other rules emit for a seed (the control)
        sps = make_engine(ver, dft, temp=temp, method="sps", k=4)
        try:
            assert any(sps.generate("the cat", n_predict=24, seed=s).tokens !=
                       alone.generate("the cat", n_predict=24, seed=s).tokens for s in range(6))
        finally:
            sps.close()
    finally:
        alone.close()
        drafted.close()


def test_the_drafts_stream_is_used_only_under_greedy():
    """Under greedy a draft draws from the seed's second stream and leaves the first (the
    verifier's) untouched; under every other rule it draws from the one stream, as recorded in
    the golden ids."""
    V = 50
    logits = np.linspace(0, 3, V, dtype=np.float32)
    out = np.empty(V, dtype=np.float32)
    sp = SamplingParams(temperature=1.0)
    for method, touches_verifier in (("greedy", False), ("sps", True), ("cactus", True)):
        s = NativeSampler(V, sp, AcceptanceParams(method=method), seed=7)
        s.draft(logits, out)
        first = Rng(7)
        if touches_verifier:
            first.uniform()
        assert s._rng.state == first.state, method

