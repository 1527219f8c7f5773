"""``gyre checkpoint write``: a tiny checkpoint of a real model family, for trying gyre offline.

The folder is a complete ``save_pretrained`` folder (a random Qwen3ForCausalLM with the family's
embedding size, its tokenizer and chat template); see docs/checkpoints.md. The converted
tokenizer is cached under ``${XDG_CACHE_HOME:-~/.cache}/gyre/tokenizers``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gyre_tools.cli import add_env_argument
from gyre_train.checkpoints import FAMILIES, family, write_checkpoint


def default_cache_dir() -> Path:
    """Where converted tokenizers are kept: ``${XDG_CACHE_HOME:-~/.cache}/gyre/tokenizers``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "gyre" / "tokenizers"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoint = subparsers.add_parser("checkpoint", help="tiny checkpoints of real model families")
    commands = checkpoint.add_subparsers(dest="checkpoint_command", metavar="CHECKPOINT_COMMAND")
    commands.required = True
    write = commands.add_parser(
        "write", help="write a tiny save_pretrained folder (model, tokenizer, chat template) of a family"
    )
    write.add_argument("--family", required=True, choices=sorted(FAMILIES), help="model family")
    add_env_argument(
        write, "--layers", "GYRE_CHECKPOINT_LAYERS", default="2", type=int, help="decoder layers"
    )
    add_env_argument(
        write,
        "--hidden",
        "GYRE_CHECKPOINT_HIDDEN",
        default="64",
        type=int,
        help="hidden size (a multiple of 8)",
    )
    add_env_argument(write, "--seed", "GYRE_CHECKPOINT_SEED", default="0", type=int, help="weights seed")
    write.add_argument("--force", action="store_true", help="write into a folder that already has files")
    write.add_argument("dir", type=Path, help="the folder to write")
    write.set_defaults(func=run_write)


def run_write(args: argparse.Namespace) -> int:
    fam = family(args.family)
    out = write_checkpoint(
        fam,
        args.dir,
        layers=args.layers,
        hidden=args.hidden,
        seed=args.seed,
        overwrite=args.force,
        cache_dir=default_cache_dir(),
    )
    print(
        f"wrote a {fam.name} checkpoint to {out}: {args.layers} layers, hidden {args.hidden}, "
        f"{fam.vocab_size:,} tokens, {fam.embedding_rows:,} embedding rows"
    )
    return 0
