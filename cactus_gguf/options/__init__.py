"""Every user-visible option, declared once.

Each :class:`Option` carries its name (the Python API and JSON name), type, default, allowed values,
help text, command-line flags (llama.cpp's names where llama.cpp has the option) and whether a
registry pair may recommend a value for it. Everything else is derived from this table:

- :class:`LoadOptions` (fixed for an engine's life) and :class:`Request` (one generation), the frozen
  dataclasses of the Python API (records.py, re-exported here), written out field by field
  (``delta: float = opt("delta")``: the
  field's default and its Option, from which the validation reads the allowed values), and the
  parameter sets below them (sampling/params.py, llama/context.py), declared the same way;
- the ``cactus-gguf run`` / ``bench`` command-line options (``cli/``) and their ``--help``;
- the benchmark's grids (``--k 4,8``, ``--delta 0.5,1``) and the flag tables of docs/options.md
  (``python docs/generate.py``; ``tests/test_options.py`` checks them against it).

Scopes: ``load`` (an engine's models and contexts), ``request`` (one generation: sampling, acceptance
rule, draft length, drafter, n_predict, stop strings, seed) and ``run`` (what only the ``run`` command
has: which models, the prompt, output format).

The table lives in table.py (its Option and Range records in option.py), the records in records.py,
the one check of a request's speculation options that needs what the caller set and what the engine
loaded in speculation.py (the CLI, the server and the engine all call it); this package re-exports
them. A constraint option's value (a grammar, a JSON schema) is compiled and checked by grammar.py,
without a model. The package imports nothing outside it but errors.py at import time (llguidance
only when a grammar is given), so every layer may use it.
"""
from __future__ import annotations

from .records import (CONSTRAINTS, LoadOptions, Request, check_fields, constraint_of, opt,
                      option_of, validate_pairing)
from .option import Option, Range
from .table import (BUDGETS, BY_NAME, DRAFT_MODEL_OPTIONS, DRAFT_VOCABS, DRAFTERS, METHODS,
                    MODEL_DRAFTERS, OPTIONS, SELF_DRAFTERS, SOLVERS, check_value, default,
                    markdown_table, normalize_json_schema, options_in, parse_endpoints,
                    parse_tensor_split)
from .speculation import check_speculation, runnable_drafters

__all__ = ["Option", "OPTIONS", "LoadOptions", "Request", "options_in", "default", "check_value",
           "validate_pairing", "markdown_table", "constraint_of", "normalize_json_schema",
           "CONSTRAINTS", "parse_endpoints", "parse_tensor_split", "METHODS", "SOLVERS", "BUDGETS",
           "DRAFTERS", "DRAFT_VOCABS", "MODEL_DRAFTERS", "SELF_DRAFTERS", "DRAFT_MODEL_OPTIONS",
           "opt", "option_of", "check_fields", "BY_NAME", "Range", "check_speculation",
           "runnable_drafters"]
