"""Training backends: the `TrainingBackend` protocol, plain PyTorch for any Hugging Face causal LM,
and Megatron-core with tensor and pipeline parallelism (on the CPU too), with its GPT-2 export.

A backend computes packed logprobs, accumulates gradients and makes one update; it does not
reduce across cells (`gyre_train.cells`) or define the loss (`gyre_train.objective`).
"""

from __future__ import annotations

from gyre_train.backends.fsdp import FsdpBackend, GatheredModel
from gyre_train.backends.megatron import MegatronBackend
from gyre_train.backends.megatron_cpu import cpu_megatron, megatron_module
from gyre_train.backends.megatron_export import ExportedModel, export_model, gpt2_config, to_gpt2
from gyre_train.backends.megatron_model import MegatronModelSpec
from gyre_train.backends.megatron_qwen3 import qwen3_spec
from gyre_train.backends.pytorch import (
    ModelSpec,
    OptimizerConfig,
    TorchBackend,
    TorchTraining,
    TrainingBackend,
)
from gyre_train.backends.warmstart import TINY_POLICY, TokenSequence, WarmStartConfig, new_policy, warm_start

__all__ = [
    "TINY_POLICY",
    "ExportedModel",
    "FsdpBackend",
    "GatheredModel",
    "MegatronBackend",
    "MegatronModelSpec",
    "ModelSpec",
    "OptimizerConfig",
    "TokenSequence",
    "TorchBackend",
    "TorchTraining",
    "TrainingBackend",
    "WarmStartConfig",
    "cpu_megatron",
    "export_model",
    "gpt2_config",
    "megatron_module",
    "new_policy",
    "qwen3_spec",
    "to_gpt2",
    "warm_start",
]
