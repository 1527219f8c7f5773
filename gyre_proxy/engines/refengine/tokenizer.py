"""Tokenizers the reference engine can run offline.

``ByteTokenizer`` needs no files: ids 0-255 are raw UTF-8 bytes, followed by a few special
tokens shaped like Qwen's (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``). A folder with
a ``tokenizer.json`` (any ``tokenizers`` model, e.g. a byte-level BPE) is loaded with
``HFTokenizer``. The engine only needs ``encode``, ``decode``, the vocabulary size and EOS, so
the proxy's own chat template and Qwen tokenizer can replace either later.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gyre_proxy.exceptions import ModelLoadError

BYTE_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_FILE = "tokenizer.json"


class Tokenizer(Protocol):
    """What the reference engine needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, special tokens from 256; EOS is ``<|im_end|>``."""

    def __init__(self, special_tokens: Sequence[str] = BYTE_SPECIAL_TOKENS, eos: str = "<|im_end|>") -> None:
        self._specials = {token: 256 + index for index, token in enumerate(special_tokens)}
        self._by_id = {index: token for token, index in self._specials.items()}
        if eos not in self._specials:
            raise ModelLoadError(f"EOS {eos!r} is not one of the special tokens {list(self._specials)}")
        self._eos = self._specials[eos]
        # Longest first so that a special token is never split into a shorter one's prefix.
        self._ordered = sorted(self._specials, key=len, reverse=True)

    @property
    def vocab_size(self) -> int:
        return 256 + len(self._specials)

    @property
    def eos_token_id(self) -> int:
        return self._eos

    def token_id(self, special: str) -> int:
        return self._specials[special]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        position = 0
        while position < len(text):
            next_special = min(
                ((found, token) for token in self._ordered if (found := text.find(token, position)) >= 0),
                default=None,
            )
            end = next_special[0] if next_special else len(text)
            ids.extend(text[position:end].encode("utf-8"))
            if next_special is None:
                break
            ids.append(self._specials[next_special[1]])
            position = end + len(next_special[1])
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token in ids:
            if 0 <= token < 256:
                pending.append(token)
                continue
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            if token in self._by_id and not skip_special_tokens:
                parts.append(self._by_id[token])
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``; EOS named by ``eos``."""

    def __init__(self, path: Path, eos: str = "<|im_end|>") -> None:
        from tokenizers import Tokenizer as RawTokenizer

        try:
            self._raw = RawTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise ModelLoadError(f"cannot load tokenizer {path}: {exc}") from exc
        eos_id = self._raw.token_to_id(eos)
        if eos_id is None:
            raise ModelLoadError(f"tokenizer {path} has no EOS token {eos!r}")
        self._eos = eos_id

    @property
    def vocab_size(self) -> int:
        return int(self._raw.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int:
        return self._eos

    def encode(self, text: str) -> list[int]:
        return list(self._raw.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._raw.decode(list(ids), skip_special_tokens=skip_special_tokens))


class QwenVocabTokenizer:
    """The real Qwen3.5/3.6 vocabulary (from the proxy's tokenizer), so a tiny model served
    behind the proxy speaks the same token ids the proxy renders prompts with."""

    def __init__(self) -> None:
        from gyre_proxy.engines.tokenizer import qwen_tokenizer

        self._tok = qwen_tokenizer()
        self._specials = frozenset(
            self._tok.special(s) for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
        )

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self._tok.special("<|im_end|>")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._specials]
        return self._tok.decode(ids)


def _checkpoint_eos(model_dir: Path) -> str:
    """The EOS a checkpoint's ``tokenizer_config.json`` names (``<|im_end|>`` without one)."""
    import json

    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return "<|im_end|>"
    try:
        raw = json.loads(path.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if isinstance(raw, dict):
        raw = raw.get("content")
    return raw if isinstance(raw, str) and raw else "<|im_end|>"


def load_tokenizer(model_dir: Path | None, name: str | None = None) -> Tokenizer:
    """``name == "qwen"``: the Qwen vocabulary; ``file:PATH``: that ``tokenizer.json``; else ``HFTokenizer`` when ``model_dir``
    holds a ``tokenizer.json``, else ``ByteTokenizer``."""
    if name == "qwen":
        return QwenVocabTokenizer()
    if name is not None and name.startswith("file:"):  # a checkpoint's tokenizer.json, by path
        path = Path(name.removeprefix("file:"))
        return HFTokenizer(path, eos=_checkpoint_eos(path.parent))
    if name not in (None, "", "byte", "auto"):
        raise ValueError(f"unknown tokenizer {name!r}; use qwen, byte or auto")
    if model_dir is not None and (model_dir / TOKENIZER_FILE).is_file():
        return HFTokenizer(model_dir / TOKENIZER_FILE, eos=_checkpoint_eos(model_dir))
    return ByteTokenizer()
