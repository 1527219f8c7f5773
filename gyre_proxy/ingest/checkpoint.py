"""A checkpoint folder's tokenizer and chat template, as the proxy's ``ChatFormat``.

``load_chat_format(DIR)`` reads what ``save_pretrained`` writes: ``tokenizer.json`` (a
byte-level BPE), the chat template from ``chat_template.jinja`` or ``tokenizer_config.json``'s
``chat_template``, the special-token strings templates use as variables (``bos_token``,
``eos_token``, ...), and the end-of-generation ids from ``generation_config.json`` and
``config.json``. The template's family picks its output parser and the token that ends a
turn: ``qwen`` (ChatML, ``<|im_end|>``, Hermes ``<tool_call>`` JSON) or ``llama3``
(``<|eot_id|>``/``<|eom_id|>``, a JSON tool call). Every failure is a ``CheckpointLoadError``
whose one line names the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from gyre_proxy.engines import CheckpointTokenizer
from gyre_proxy.exceptions import CheckpointLoadError
from gyre_proxy.ingest.jinja_format import JinjaChatFormat, compile_template

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_VARIABLES = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True, slots=True)
class Family:
    """A template family: how to recognise it, where a turn ends, what else stops generation."""

    name: str
    marker: str  # an added token the family's templates write
    end_tokens: tuple[str, ...]  # a complete answer ends with one of these
    stop_tokens: tuple[str, ...] = ()  # also end generation, if the vocabulary has them


FAMILIES = (
    Family("qwen", "<|im_start|>", ("<|im_end|>",), ("<|endoftext|>",)),
    Family("llama3", "<|start_header_id|>", ("<|eot_id|>", "<|eom_id|>"), ("<|end_of_text|>",)),
)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointLoadError(f"{path} is not a JSON object")
    return value


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_source(model_dir: Path, config: dict[str, Any]) -> tuple[str, Path]:
    file = model_dir / TEMPLATE_FILE
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8"), file
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointLoadError(f"cannot read {file}: {exc}") from exc
    raw = config.get("chat_template")
    if isinstance(raw, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("default")
    if not isinstance(raw, str) or not raw.strip():
        raise CheckpointLoadError(
            f"{model_dir} has no chat template (neither {TEMPLATE_FILE} nor a chat_template in {TOKENIZER_CONFIG})"
        )
    return raw, model_dir / TOKENIZER_CONFIG


def _eos_ids(model_dir: Path) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            raw = _read_json(path).get("eos_token_id")
            ids.extend(raw if isinstance(raw, list) else [raw] if isinstance(raw, int) else [])
    return ids


def model_rows(model_dir: Path) -> int | None:
    """The embedding's rows (``vocab_size`` in ``config.json``), None without a config."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    config = _read_json(path)
    rows = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return int(rows) if isinstance(rows, int) else None


def load_tokenizer(model_dir: Path) -> CheckpointTokenizer:
    """The checkpoint's tokenizer, refused when it has more ids than the model's embedding."""
    path = model_dir / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointLoadError(
            f"{model_dir} has no {TOKENIZER_FILE} (write the tokenizer with save_pretrained)"
        )
    tok = CheckpointTokenizer(path, name=model_dir.name)
    rows = model_rows(model_dir)
    if rows is not None and tok.vocab_size > rows:
        raise CheckpointLoadError(
            f"{path} has {tok.vocab_size} ids but the model's embedding ({model_dir / 'config.json'}) "
            f"has only {rows} rows"
        )
    return tok


def load_chat_format(model_dir: Path | str) -> JinjaChatFormat:
    """The ``ChatFormat`` of the checkpoint in ``model_dir`` (see the module docstring)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointLoadError(f"{model_dir} is not a folder (a save_pretrained checkpoint)")
    tok = load_tokenizer(model_dir)
    config_path = model_dir / TOKENIZER_CONFIG
    config = _read_json(config_path) if config_path.is_file() else {}
    source, where = _template_source(model_dir, config)
    try:
        compile_template(source)
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        raise CheckpointLoadError(
            f"{where}: the chat template does not compile (line {line}): {exc}"
        ) from exc
    family = next((f for f in FAMILIES if f.marker in tok.specials and f.marker in source), None)
    if family is None:
        known = ", ".join(f"{f.name} (writes {f.marker})" for f in FAMILIES)
        raise CheckpointLoadError(f"{where}: no output parser for this template's family; gyre knows {known}")
    variables = {name: _token_text(config.get(name)) for name in SPECIAL_VARIABLES}
    stops = [tok.special(t) for t in family.stop_tokens if t in tok.specials]
    eos = [i for i in _eos_ids(model_dir) if 0 <= i < tok.vocab_size]
    return JinjaChatFormat(
        tok,
        source,
        family=family.name,
        stop_ids=[*eos, *stops],
        end_tokens=[t for t in family.end_tokens if t in tok.specials],
        variables=variables,
        name=str(where),
    )
