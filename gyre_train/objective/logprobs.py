"""Per-token logprobs of a packed micro-step under any Hugging Face causal LM.

Packed rows must not see each other: position ids restart per row and a block-diagonal causal
4-D mask (additive, accepted as-is by eager and SDPA attention) keeps attention inside a row.
The loss reads logprobs at target tokens only, so for a model whose logits are its last hidden
state times an output matrix (Qwen, Llama and the like) the head runs at those positions alone,
the vocabulary in chunks, the softmax recomputed in backward rather than stored: a micro-step of
T tokens over V words then never holds a [T, V] tensor (4 GB at T = 4K, V = 248K). Other models
take the general path, which materializes the [T, V] logits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gyre_train.objective.packed import PackedStep


def block_causal_mask(row_starts: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, T, T] additive mask: 0 where query i may attend key j (same row, j <= i), else min.

    row_starts: [R + 1] cumulative row boundaries, as in PackedStep.
    """
    lengths = np.diff(row_starts)  # [R]
    segment = torch.tensor(np.repeat(np.arange(lengths.shape[0]), lengths), device=device)  # [T]
    total = int(segment.shape[0])
    index = torch.arange(total, device=device)
    allowed = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])  # [T, T]
    mask = torch.zeros((total, total), dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


VOCAB_CHUNK = 16_384  # output-matrix rows per chunk of the targets-only head


def chunked_log_partition(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[U] logsumexp over the rows of ``weight`` [V, H] of ``hidden @ weight.T``, a VOCAB_CHUNK
    of rows at a time (the [U, V] logits never whole)."""
    lse = hidden.new_full((hidden.shape[0],), float("-inf"))
    for start in range(0, weight.shape[0], VOCAB_CHUNK):
        lse = torch.logaddexp(lse, torch.logsumexp(hidden @ weight[start : start + VOCAB_CHUNK].T, dim=-1))
    return lse


def subtract_softmax_terms(
    g: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    lse: torch.Tensor,
    grad_hidden: torch.Tensor,
    grad_weight: torch.Tensor | None,
) -> torch.Tensor:
    """The log partition's part of the backward of log softmax(h W^T)[y]: for each chunk of
    ``weight``'s rows, g * softmax is taken off the hidden states' gradient (returned) and, when
    given, off ``grad_weight`` in place. ``g`` [U, 1] is the output gradient, ``lse`` [U] the
    log partition the softmax is normalised by."""
    for start in range(0, weight.shape[0], VOCAB_CHUNK):
        chunk = weight[start : start + VOCAB_CHUNK]  # [C, H]
        scaled = g * torch.exp(hidden @ chunk.T - lse[:, None])  # [U, C]: grad times softmax
        grad_hidden = grad_hidden - scaled @ chunk
        if grad_weight is not None:
            grad_weight[start : start + VOCAB_CHUNK] -= scaled.T @ hidden
    return grad_hidden


class _TargetLogprob(torch.autograd.Function):
    """log softmax(h W^T)[y] per row of h, without the [U, V] matrix surviving the call."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # hidden [U, H] at the positions before each target, weight [V, H], targets [U]
        lse = chunked_log_partition(hidden, weight)  # [U] log partition
        ctx.save_for_backward(hidden, weight, targets, lse)
        return (hidden * weight[targets]).sum(-1) - lse  # [U]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        g = grad[:, None]  # [U, 1]
        grad_hidden = g * weight[targets]  # d(h . w_y) / dh
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros_like(weight)
            grad_weight.index_add_(0, targets, g * hidden)
        grad_hidden = subtract_softmax_terms(g, hidden, weight, lse, grad_hidden, grad_weight)
        return grad_hidden, grad_weight, None


# The targets-only head: (hidden [U, H] before each target, targets [U]) -> [U] logprobs.
TargetHead = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def target_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[U] log softmax(hidden W^T)[targets] in float32, the vocabulary in chunks."""
    picked: torch.Tensor = _TargetLogprob.apply(hidden.float(), weight.float(), targets)  # type: ignore[no-untyped-call]
    return picked


def _head_is_linear(model: torch.nn.Module) -> bool:
    """Whether logits are ``last hidden state @ output_embeddings.weight.T`` and nothing more."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    backbone = getattr(model, "model", None)
    config = getattr(model, "config", None)
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and isinstance(backbone, torch.nn.Module)
        and getattr(config, "model_type", "") in ("qwen2", "qwen3", "llama", "mistral")
        and not getattr(config, "final_logit_softcapping", None)
    )


def packed_token_logprobs(
    model: torch.nn.Module, step: PackedStep, *, targets_only: bool = True, head: TargetHead | None = None
) -> torch.Tensor:
    """[T] log pi_theta(token_k | earlier tokens of its row); 0 at each row's first token, and,
    with ``targets_only`` on a linear-head model, 0 at every non-target token.

    Runs with gradients enabled (wrap in torch.no_grad() for pass 1). On a linear-head model
    with ``targets_only`` the body runs once per row; otherwise the model runs once over the
    packed step and must accept input_ids, position_ids and a 4-D attention_mask and return
    `.logits`. ``head`` computes the targets-only head (default: `target_logprobs` on the output
    embeddings' weight; an FSDP backend passes its head unit, so the weight is gathered around it).
    """
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    total = len(step)
    if total == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    input_ids = torch.tensor(step.token_ids, dtype=torch.long, device=device)  # [T]
    position_ids = torch.tensor(step.position_ids, dtype=torch.long, device=device)  # [T]
    if targets_only and _head_is_linear(model):
        return _target_logprobs(model, step, input_ids, position_ids, head)
    output = model(
        input_ids=input_ids[None],
        position_ids=position_ids[None],
        attention_mask=block_causal_mask(step.row_starts, dtype, device),
        use_cache=False,
    )
    logits: torch.Tensor = output.logits[0, :-1].float()  # [T - 1, V] predicts tokens 1..T-1
    predicted = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[1:, None])[:, 0]  # [T - 1]
    logprobs = torch.cat([predicted.new_zeros(1), predicted])  # [T]
    # A row's first token would be "predicted" by the previous row's last one: not a real prediction.
    return logprobs.masked_fill(position_ids == 0, 0.0)


def _target_logprobs(
    model: Any, step: PackedStep, input_ids: torch.Tensor, position_ids: torch.Tensor, head: TargetHead | None
) -> torch.Tensor:
    device = input_ids.device
    # The body runs row by row (plain causal attention over each row) rather than once over the
    # packed step with a [T, T] block-causal mask: the same attention, without its T^2 cost.
    bounds = step.row_starts.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != input_ids.shape[0]:
        raise ValueError(
            f"row_starts {bounds[:3]}...{bounds[-1:]} do not span the step's {input_ids.shape[0]} tokens"
        )
    hidden = torch.cat(
        [
            model.model(
                input_ids=input_ids[None, start:end],
                position_ids=position_ids[None, start:end],
                use_cache=False,
            ).last_hidden_state[0]
            for start, end in itertools.pairwise(bounds)
            if end > start
        ]
    )  # [T, H]
    # A target at a row's first token has no prediction; the packer never makes one.
    where = torch.tensor(np.flatnonzero(step.target_mask & (step.position_ids > 0)), device=device)  # [U]
    if head is None:
        weight = model.get_output_embeddings().weight  # [V, H]
        picked = target_logprobs(hidden[where - 1], weight, input_ids[where])  # [U]
    else:
        picked = head(hidden[where - 1], input_ids[where])  # [U]
    return torch.zeros(input_ids.shape[0], dtype=torch.float32, device=device).index_put((where,), picked)
