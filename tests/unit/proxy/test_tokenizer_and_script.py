"""Byte tokenizer and scripted policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_proxy.engines.refengine import (
    ByteTokenizer,
    ScriptedPolicy,
    ScriptEntry,
    ScriptRule,
    load_tokenizer,
)
from gyre_proxy.exceptions import ScriptError


@given(st.text(max_size=200))
def test_byte_tokenizer_round_trips_any_text(text: str) -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert all(0 <= token < tokenizer.vocab_size for token in ids)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tokenizer.token_id("<|im_start|>")
    assert ids[-1] == tokenizer.eos_token_id == tokenizer.token_id("<|im_end|>")
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.vocab_size == 259


def test_load_tokenizer_falls_back_to_bytes(tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
    assert isinstance(load_tokenizer(None), ByteTokenizer)


def test_in_order_script_hands_out_each_entry_once() -> None:
    policy = ScriptedPolicy([ScriptEntry((1,)), ScriptEntry((2, 3))])
    assert [policy.next_output("") for _ in range(3)] == [(1,), (2, 3), None]


def test_cycle_script_wraps_around() -> None:
    policy = ScriptedPolicy([ScriptEntry((1,)), ScriptEntry((2,))], ScriptRule.CYCLE)
    assert [policy.next_output("") for _ in range(3)] == [(1,), (2,), (1,)]


def test_match_script_picks_by_prompt() -> None:
    tokenizer = ByteTokenizer()
    policy = ScriptedPolicy.from_json(
        {
            "rule": "match",
            "outputs": [{"text": "A", "when": "alpha"}, {"ids": [66], "when": "beta"}],
        },
        tokenizer,
    )
    assert policy.next_output("the beta prompt") == (66,)
    assert policy.next_output("alpha") == (65, tokenizer.eos_token_id)
    assert policy.next_output("gamma") is None


def test_script_file_texts_are_tokenized(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"outputs": ["ok", [1, 2]], "append_eos": False}))
    policy = ScriptedPolicy.from_file(path, ByteTokenizer())
    assert policy.entries == (ScriptEntry((111, 107)), ScriptEntry((1, 2)))


@pytest.mark.parametrize(
    "data",
    [
        {"outputs": []},
        {"outputs": [3.5]},
        {"outputs": [""], "append_eos": False},
        {"rule": "random", "outputs": ["x"]},
        {"rule": "match", "outputs": ["x"]},
        ["not", "an", "object"],
    ],
)
def test_malformed_scripts_are_rejected(data: object) -> None:
    with pytest.raises(ScriptError):
        ScriptedPolicy.from_json(data, ByteTokenizer())


def test_script_ids_must_fit_the_vocabulary() -> None:
    policy = ScriptedPolicy([ScriptEntry((1, 400))])
    with pytest.raises(ScriptError, match="outside the vocabulary"):
        policy.check_vocab(320)
