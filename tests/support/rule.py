"""What the speculation-rule tests expect of the options table."""
from __future__ import annotations

# every speculation setting; a new one added to the table without `applies` would not be here
NAMES = ["k", "k_max", "method", "delta", "solver", "budget", "output_kl", "typical_epsilon",
         "typical_alpha", "accept_top_k", "ears_alpha", "top_gap", "protect_ends", "top_gap_scope",
         "drafter",
         "ngram_max", "ngram_min", "draft_window", "draft_vocab", "draft_min", "draft_p_min",
         "spec_synth_rates", "spec_synth_len", "draft_temp"]
