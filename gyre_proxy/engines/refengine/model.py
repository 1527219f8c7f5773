"""Building and loading the reference engine's causal LM, with no network.

A model comes either from a config (any Hugging Face causal LM class through
``AutoModelForCausalLM.from_config``; by default a tiny Qwen3) initialised from a seed, or
from a local folder written by ``save_pretrained``. Weights are float32 on the CPU. Loading
new weights into a live model (``load_weights``) copies in place, so the engine's references
to the module stay valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gyre_proxy.engines.refengine.tokenizer import Tokenizer, load_tokenizer
from gyre_proxy.exceptions import ModelLoadError

# A few layers and a vocabulary just over ByteTokenizer's 259 ids: builds in milliseconds.
# QWEN_MODEL_CONFIG below is the same tiny model over the Qwen vocabulary, for the proxy.
DEFAULT_MODEL_CONFIG: Mapping[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "eos_token_id": 258,
}

QWEN_MODEL_CONFIG: Mapping[str, Any] = {
    **DEFAULT_MODEL_CONFIG,
    "vocab_size": 248_320,  # the Qwen3.5/3.6 vocabulary and its special tokens, rounded up
    "hidden_size": 32,
    "intermediate_size": 64,
    "tie_word_embeddings": True,
    "eos_token_id": 248_046,  # <|im_end|>
    "max_position_embeddings": 65_536,
}


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: ``model_dir`` if set, else ``config`` (default tiny Qwen3)."""

    config: Mapping[str, Any] | None = None
    model_dir: Path | None = None
    seed: int = 0
    tokenizer: str | None = None  # "qwen" for the Qwen vocabulary; default: from model_dir or bytes
    # Where the weights and the KV cache live: "cpu" (the default), "cuda" or "cuda:N". Sampling
    # stays on the CPU (each step's last logits are copied there), so a seed draws the same
    # tokens from the same logits on either device.
    device: str = "cpu"


@dataclass
class LoadedModel:
    """A model ready to serve, with its tokenizer and limits."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    model_path: str
    vocab_size: int
    max_positions: int
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)


def engine_device(name: str) -> torch.device:
    """The torch device named by an engine's ``device`` setting; raises ``ModelLoadError`` for a
    name that is not "cpu", "cuda" or "cuda:N", or a CUDA device this process cannot see."""
    if name == "cpu":
        return torch.device("cpu")
    head, _, index = name.partition(":")
    if head != "cuda" or (index and not index.isdigit()):
        raise ModelLoadError(f"engine device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if not torch.cuda.is_available():
        raise ModelLoadError(f"engine device {name!r}: torch sees no CUDA device here")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelLoadError(f"engine device {name!r}: only {torch.cuda.device_count()} CUDA devices here")
    return device


def _config_from_dict(config: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    values = dict(config)
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ModelLoadError("a model config needs a 'model_type' (for example 'qwen3')")
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"bad model config: {exc}") from exc


def _eos_ids(hf_config: Any, tokenizer: Tokenizer) -> frozenset[int]:
    raw = getattr(hf_config, "eos_token_id", None)
    ids = set(raw) if isinstance(raw, list) else ({raw} if isinstance(raw, int) else set())
    ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def load_model(source: ModelSource) -> LoadedModel:
    """Build or load the model named by ``source``; raises ``ModelLoadError``."""
    from transformers import AutoModelForCausalLM

    model: Any
    if source.model_dir is not None:
        if not (source.model_dir / "config.json").is_file():
            raise ModelLoadError(f"{source.model_dir} has no config.json (write it with save_pretrained)")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(source.model_dir), local_files_only=True, dtype=torch.float32
            )
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load {source.model_dir}: {exc}") from exc
        model_path = str(source.model_dir)
    else:
        default = QWEN_MODEL_CONFIG if source.tokenizer == "qwen" else DEFAULT_MODEL_CONFIG
        hf_config = _config_from_dict(source.config or default)
        # The seed fixes the initial weights, so two engines built alike are identical.
        torch.manual_seed(source.seed)
        try:
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise ModelLoadError(f"no causal LM for this config: {exc}") from exc
        model_path = f"gyre-reference/{hf_config.model_type}"
    model.to(engine_device(source.device))
    model.eval()
    tokenizer = load_tokenizer(source.model_dir, source.tokenizer)
    vocab_size = int(model.config.vocab_size)
    if tokenizer.vocab_size > vocab_size:
        raise ModelLoadError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary only {vocab_size}"
        )
    max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 20)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_path=model_path,
        vocab_size=vocab_size,
        max_positions=max_positions,
        eos_token_ids=_eos_ids(model.config, tokenizer),
    )


def save_model_dir(model: torch.nn.Module, path: Path) -> Path:
    """Write ``model`` as safetensors plus ``config.json`` under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))  # type: ignore[operator]
    return path


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the ``*.safetensors`` files under ``path`` (a folder or one file)."""
    from safetensors.torch import load_file

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors under {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


@torch.no_grad()
def load_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Copy ``tensors`` into ``model`` in place; returns how many were loaded.

    A partial update is allowed (as in SGLang); an unknown name or a wrong shape raises
    ``ModelLoadError`` before anything is copied.
    """
    state = model.state_dict()
    for name, tensor in tensors.items():
        if name not in state:
            raise ModelLoadError(f"the model has no parameter {name!r}")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ModelLoadError(f"{name}: shape {tuple(tensor.shape)} != {tuple(state[name].shape)}")
    for name, tensor in tensors.items():
        state[name].copy_(tensor.to(state[name].dtype))
    return len(tensors)
