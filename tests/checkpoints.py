"""Tiny checkpoints of each model family for tests, written once per session.

A test module that needs one imports the fixture (``from tests.checkpoints import
family_checkpoint  # noqa: F401``) and calls it with a family name: ``family_checkpoint("qwen3")``
is the folder of a complete save_pretrained checkpoint (see gyre_train.checkpoints). The converted
tokenizers are cached where ``gyre checkpoint write`` caches them, so a session converts each
vocabulary at most once per machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gyre_tools.checkpoint import default_cache_dir
from gyre_train.checkpoints import write_checkpoint


def write_family_checkpoint(family: str, root: Path, *, layers: int = 2, hidden: int = 64) -> Path:
    """A checkpoint of ``family`` in a new folder under ``root``."""
    return write_checkpoint(
        family, root / family.replace(".", "_"), layers=layers, hidden=hidden, cache_dir=default_cache_dir()
    )


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``family -> folder``: each family's checkpoint is written on first use and then shared."""
    written: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in written:
            written[family] = write_family_checkpoint(family, tmp_path_factory.mktemp("checkpoints"))
        return written[family]

    return folder


def template_ids(
    hf: Any, messages: list[dict[str, Any]], tools: Any = None, *, thinking: bool = False
) -> list[int]:
    """What the checkpoint's own ``apply_chat_template(..., tokenize=True,
    add_generation_prompt=True)`` gives for ``messages`` (tool-call arguments as objects)."""
    out = hf.apply_chat_template(
        with_objects(messages),
        tools=tools,
        tokenize=True,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers 5 returns a mapping
    return [int(i) for i in ids]


def template_text(
    hf: Any, messages: list[dict[str, Any]], tools: Any = None, *, thinking: bool = False
) -> str:
    """The same conversation as text (``tokenize=False``), with the generation prompt."""
    text: str = hf.apply_chat_template(
        with_objects(messages),
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    return text


def with_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments as objects, as OpenAI-compatible servers hand them to a template."""
    out = []
    for m in messages:
        calls = [
            {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m.get("tool_calls", [])
        ]
        out.append({**m, "tool_calls": calls} if calls else m)
    return out
