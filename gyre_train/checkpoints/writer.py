"""``write_checkpoint``: a complete ``save_pretrained`` folder of a tiny model of one family.

The folder holds what a user's checkpoint holds: ``config.json`` and ``generation_config.json``
(the family's end and start ids), ``model.safetensors`` (a seeded random ``Qwen3ForCausalLM``,
float32, tied embeddings, with the family's embedding row count), the tokenizer files and the
chat template. Nothing is downloaded. The model is random: it exists to carry the family's
shapes and ids through the engines and the trainer, not to answer well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre_train.checkpoints.families import Family, family
from gyre_train.checkpoints.tokenizer import write_tokenizer
from gyre_train.exceptions import InvalidConfigError

HEADS = 4
KV_HEADS = 2


def model_config(fam: Family, *, layers: int, hidden: int) -> dict[str, Any]:
    """The ``config.json`` values (a Qwen3 architecture) of a tiny model of ``fam``."""
    if layers < 1:
        raise InvalidConfigError(f"layers must be at least 1, not {layers}")
    if hidden < 2 * HEADS or hidden % (2 * HEADS):
        raise InvalidConfigError(f"hidden must be a positive multiple of {2 * HEADS}, not {hidden}")
    eos = [fam.token_id(t) for t in fam.config_eos]
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": fam.embedding_rows,
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": hidden // HEADS,
        "max_position_embeddings": 32_768,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "bos_token_id": fam.token_id(fam.config_bos),
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": fam.token_id(fam.pad_token),
    }


def write_checkpoint(
    family_name: str | Family,
    out_dir: Path | str,
    *,
    layers: int = 2,
    hidden: int = 64,
    seed: int = 0,
    overwrite: bool = False,
    cache_dir: Path | None = None,
) -> Path:
    """Write a tiny checkpoint of ``family_name`` ("qwen3", "qwen3.6" or "llama3") to ``out_dir``.

    Returns the folder. The weights depend only on ``seed``, ``layers`` and ``hidden``. Raises
    ``InvalidConfigError`` for an unknown family, a bad size, or an ``out_dir`` that is a file
    or a folder with files in it (unless ``overwrite``). ``cache_dir`` keeps the converted
    tokenizer between calls (see ``gyre_train.checkpoints.tokenizer``).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    fam = family_name if isinstance(family_name, Family) else family(family_name)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidConfigError(f"{out} is a file, not a folder for a checkpoint")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InvalidConfigError(f"{out} is not empty (overwrite=True, or --force, writes over it)")
    values = model_config(fam, layers=layers, hidden=hidden)
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=values["bos_token_id"],
        eos_token_id=[fam.token_id(t) for t in fam.eos_tokens],
        pad_token_id=values["pad_token_id"],
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    write_tokenizer(fam, out, cache_dir)
    return out
