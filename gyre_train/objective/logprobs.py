"""Per-token logprobs of a packed micro-step under any Hugging Face causal LM.

Packed rows must not see each other: position ids restart per row and a block-diagonal causal
4-D mask (additive, accepted as-is by eager and SDPA attention) keeps attention inside a row.
It materializes [T, V] logits at once, so it suits small models and tests, not 700K-token rows.
"""

from __future__ import annotations

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


def packed_token_logprobs(model: torch.nn.Module, step: PackedStep) -> torch.Tensor:
    """[T] log pi_theta(token_k | earlier tokens of its row); 0 at each row's first token.

    Runs one forward pass with gradients enabled (wrap in torch.no_grad() for pass 1). The model
    must accept input_ids, position_ids and a 4-D attention_mask and return `.logits`.
    """
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    total = len(step)
    if total == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    input_ids = torch.tensor(step.token_ids, dtype=torch.long, device=device)  # [T]
    position_ids = torch.tensor(step.position_ids, dtype=torch.long, device=device)  # [T]
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
