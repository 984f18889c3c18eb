"""Structured output on the real Qwen2.5-Coder pair: every output of a JSON-schema-constrained run,
SpS and Cactus, 20 seeds per schema, parses and validates (the ``jsonschema`` package); a GBNF
grammar case; the drafts really are accepted under the grammar."""
from __future__ import annotations

import json

import jsonschema
import pytest

from cactus_gguf.options import LoadOptions
from cactus_gguf.speculative import Engine

SEEDS = range(20)
WARPS = dict(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)

SCHEMAS = {  # name: (task, schema)
    "flat": ("Extract the person: 'Maria Lopez, 34, lives in Valencia.'",
             {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"},
                                               "city": {"type": "string"}},
              "required": ["name", "age", "city"], "additionalProperties": False}),
    "nested": ("Extract the order: 'Order 1182 from Ken Ito (ken@ito.jp): 2 lamps.'",
               {"type": "object", "properties": {
                   "order_id": {"type": "integer"},
                   "customer": {"type": "object", "properties": {
                       "name": {"type": "string"}, "email": {"type": "string"}},
                       "required": ["name", "email"], "additionalProperties": False},
                   "item": {"type": "object", "properties": {
                       "what": {"type": "string"}, "count": {"type": "integer", "minimum": 1}},
                       "required": ["what", "count"], "additionalProperties": False}},
                "required": ["order_id", "customer", "item"], "additionalProperties": False}),
    "array": ("List the programming languages mentioned: 'We port the Go service to Rust, keep "
              "the Python scripts and drop Perl.'",
              {"type": "object", "properties": {"languages": {
                  "type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 6}},
               "required": ["languages"], "additionalProperties": False}),
    "enum": ("Classify the review: 'The battery died after two days. Never again.'",
             {"type": "object", "properties": {
                 "sentiment": {"enum": ["positive", "negative", "neutral"]},
                 "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["sentiment", "stars"], "additionalProperties": False}),
    "bounds": ("Give the reading as JSON: 'Sensor 7: 21.5 degrees, humidity 40 percent.'",
               {"type": "object", "properties": {
                   "sensor": {"type": "integer", "minimum": 0, "maximum": 99},
                   "celsius": {"type": "number", "minimum": -50, "maximum": 60},
                   "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
                   "note": {"type": "string"}},
                "required": ["sensor", "celsius", "humidity"], "additionalProperties": False}),
}


@pytest.fixture(scope="module")
def engine(qwen_pair):
    ver, dft = qwen_pair
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_threads=2)) as eng:
        yield eng


def prompt(eng, task):
    return eng.format_chat([{"role": "user", "content": task + " Answer with JSON only."}])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_output_validates(engine, name):
    task, schema = SCHEMAS[name]
    text = prompt(engine, task)
    accepted = drafted = 0
    for method in ("sps", "cactus"):
        for seed in SEEDS:
            r = engine.generate(text, n_predict=120, seed=seed, k=4, method=method, delta=1.0,
                                json_schema=schema, **WARPS)
            assert r.stop_reason == "eos", (method, seed, r.text)
            jsonschema.validate(json.loads(r.text), schema)
            accepted += r.stats.n_accepted
            drafted += r.stats.n_drafted
    assert drafted > 0 and accepted / drafted > 0.5  # speculation really runs under the grammar


def test_a_gbnf_grammar(engine):
    grammar = r'''root ::= date " " ("AM" | "PM")
date ::= [0-9]{4} "-" [0-1][0-9] "-" [0-3][0-9]'''
    text = prompt(engine, "When did the meeting happen? 'We met on March 3rd 2021 in the "
                          "morning.' Answer as YYYY-MM-DD AM/PM.")
    import re

    for method in ("sps", "cactus"):
        for seed in range(5):
            r = engine.generate(text, n_predict=30, seed=seed, k=4, method=method,
                                grammar=grammar, **WARPS)
            assert r.stop_reason == "eos" and re.fullmatch(r"\d{4}-[01]\d-[0-3]\d (AM|PM)",
                                                           r.text), r.text
