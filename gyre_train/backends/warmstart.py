"""The built-in starting policy: a tiny Qwen3 over the real Qwen vocabulary, warm-started by a
short supervised step on demonstrations, so RL starts well above zero and well below one.

The model is ``TINY_POLICY`` (two layers, hidden size 64, tied embeddings) with two changes at
initialisation that let a fresh tiny model learn to copy from a tool result quickly: Qwen3
RMS-normalises queries and keys per head, so with norm weight 1 an attention logit is at most
sqrt(head_dim) = 4 and attention cannot focus on one of a few hundred positions; the q/k norm
weights start at 2. The final norm starts at 4 so the tied head's logits are not flat.

Supervised training is exact and cheap: every embedding row of a token that never appears in
the demonstrations is zeroed, so it gets no gradient and its logit stays exactly 0; the
full-vocabulary log-partition is then ``logsumexp(seen logits, log(#unseen))`` and the network
is trained as a compact copy over the seen tokens only (a few hundred head columns instead of
248k), then written back. Two stages: short snippets (a tool result and the call that uses it)
until the probe tokens' loss falls below a threshold, then the full demonstrations.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gyre_train.backends.pytorch import ModelSpec, build_model
from gyre_train.exceptions import InvalidConfigError

TINY_POLICY: Mapping[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 248_320,  # the Qwen3.5/3.6 vocabulary and its special tokens, rounded up
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 16_384,
    "tie_word_embeddings": True,
    "eos_token_id": 248_046,  # <|im_end|>
    "rope_theta": 10_000.0,
}
QK_NORM_INIT = 2.0
FINAL_NORM_INIT = 4.0


@dataclass(frozen=True, slots=True)
class TokenSequence:
    """Token ids with the positions trained on (``targets``) and, for stage 1, the positions
    whose loss says the skill has emerged (``probe``, a subset of the targets)."""

    ids: tuple[int, ...]
    targets: tuple[bool, ...]
    probe: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.targets) or (self.probe and len(self.probe) != len(self.ids)):
            raise InvalidConfigError("ids, targets and probe must have one entry per token")
        if self.targets and self.targets[0]:
            raise InvalidConfigError("the first token has no context: it cannot be a target")


@dataclass(frozen=True, slots=True)
class WarmStartConfig:
    lr: float = 3e-3
    snippet_batch: int = 16
    snippet_max_steps: int = 1200
    snippet_target_loss: float = 0.3  # mean NLL of the probe tokens that ends stage 1
    check_every: int = 50
    steps: int = 300  # stage 2
    batch: int = 8
    seed: int = 0


def new_policy(seed: int, config: Mapping[str, Any] = TINY_POLICY) -> Any:
    """A fresh tiny policy (a Hugging Face causal LM) with the initialisation the module
    docstring explains."""
    model: Any = build_model(ModelSpec(config=config, seed=seed))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.fill_(QK_NORM_INIT)
        model.model.norm.weight.fill_(FINAL_NORM_INIT)
    return model


class _Compact:
    """The policy with only the seen tokens' embedding rows; ``remap`` maps full ids to rows."""

    def __init__(self, full: Any, seen: Sequence[int]) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        values = {k: v for k, v in full.config.to_dict().items() if k in TINY_POLICY and k != "model_type"}
        values.update(vocab_size=len(seen), eos_token_id=None)
        self.model: Any = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(full.config.model_type, **values), dtype=torch.float32
        )  # type: ignore[no-untyped-call]
        body = {k: v for k, v in full.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
        self.model.load_state_dict(body, strict=False)
        self.seen = torch.tensor(sorted(seen))
        with torch.no_grad():
            self.model.get_input_embeddings().weight.copy_(full.get_input_embeddings().weight[self.seen])
        self.remap = torch.full((int(full.config.vocab_size),), -1, dtype=torch.long)
        self.remap[self.seen] = torch.arange(len(seen))
        self.log_unseen = math.log(int(full.config.vocab_size) - len(seen))

    def write_back(self, full: Any) -> None:
        body = {
            k: v for k, v in self.model.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k
        }
        full.load_state_dict(body, strict=False)
        with torch.no_grad():
            emb = full.get_input_embeddings().weight
            emb.zero_()
            emb[self.seen] = self.model.get_input_embeddings().weight

    def nll(self, batch: Sequence[TokenSequence], use_probe: bool = False, shared: int = 0) -> torch.Tensor:
        """Mean NLL of the targets (or probe tokens) under the full-vocabulary softmax.

        The first ``shared`` tokens are the same in every sequence and hold no target: they run
        once and their key/value cache serves the whole batch."""
        from transformers import DynamicCache

        width = max(len(s.ids) for s in batch) - shared
        ids = torch.zeros((len(batch), width), dtype=torch.long)  # [b, w], right padded
        att = torch.zeros((len(batch), shared + width), dtype=torch.long)
        tgt = torch.zeros((len(batch), width), dtype=torch.bool)
        att[:, :shared] = 1
        for i, s in enumerate(batch):
            n = len(s.ids) - shared
            ids[i, :n] = self.remap[torch.tensor(s.ids[shared:])]
            att[i, shared : shared + n] = 1
            tgt[i, :n] = torch.tensor((s.probe if use_probe else s.targets)[shared:])
        cache = None
        if shared:
            prefix = self.remap[torch.tensor(batch[0].ids[:shared])]
            cache = DynamicCache(config=self.model.config)
            self.model.model(input_ids=prefix[None], cache=cache, use_cache=True)
            cache.batch_repeat_interleave(len(batch))
        positions = torch.arange(shared, shared + width)[None].expand(len(batch), width)
        hidden = self.model.model(
            input_ids=ids,
            attention_mask=att,
            position_ids=positions,
            past_key_values=cache,
            use_cache=shared > 0,
        ).last_hidden_state  # [b, w, H]
        bi, ti = torch.nonzero(tgt, as_tuple=True)  # [U] each
        weight = self.model.get_input_embeddings().weight  # [S, H]
        logits = hidden[bi, ti - 1] @ weight.T  # [U, S]: position t - 1 predicts token t
        unseen = logits.new_full((logits.shape[0], 1), self.log_unseen)  # every unseen logit is 0
        log_z = torch.logsumexp(torch.cat([logits, unseen], dim=1), dim=1)  # [U]
        loss: torch.Tensor = (log_z - logits.gather(1, ids[bi, ti, None])[:, 0]).mean()
        return loss


def warm_start(
    model: Any,
    demonstrations: Sequence[TokenSequence],
    snippets: Sequence[TokenSequence],
    config: WarmStartConfig,
) -> dict[str, float]:
    """Train ``model`` in place on ``snippets`` (stage 1) then ``demonstrations`` (stage 2).

    Returns figures of the run (steps, losses, seconds). Tokens in neither set keep zero rows.
    """
    started = time.monotonic()
    if not demonstrations:
        raise InvalidConfigError("a warm start needs at least one demonstration")
    seen = sorted({t for s in (*demonstrations, *snippets) for t in s.ids})
    with torch.no_grad():
        keep = torch.zeros(model.get_input_embeddings().weight.shape[0], dtype=torch.bool)
        keep[seen] = True
        model.get_input_embeddings().weight[~keep] = 0.0
    compact = _Compact(model, seen)
    compact.model.train()
    optimizer = torch.optim.AdamW(compact.model.parameters(), lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)

    def step(loss: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(compact.model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    probe_loss = float("nan")
    snippet_steps = 0
    if snippets:
        held, train = list(snippets[-64:]), list(snippets[:-64]) or list(snippets)
        while snippet_steps < config.snippet_max_steps:
            for group in optimizer.param_groups:
                group["lr"] = config.lr * min(1.0, (snippet_steps + 1) / 10)
            step(compact.nll(rng.sample(train, min(config.snippet_batch, len(train)))))
            snippet_steps += 1
            if snippet_steps % config.check_every == 0:
                with torch.no_grad():
                    probe_loss = float(compact.nll(held, use_probe=True))
                if probe_loss < config.snippet_target_loss:
                    break
    stage1_s = time.monotonic() - started
    shared = _shared_prefix(demonstrations)
    losses: list[float] = []
    for i in range(config.steps):
        decay = min(1.0, max(0.1, (config.steps - i) / (0.3 * config.steps)))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * decay
        batch = rng.sample(list(demonstrations), min(config.batch, len(demonstrations)))
        losses.append(step(compact.nll(batch, shared=shared)))
    compact.write_back(model)
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return {
        "seen_tokens": float(len(seen)),
        "snippet_steps": float(snippet_steps),
        "snippet_probe_loss": probe_loss,
        "steps": float(config.steps),
        "final_loss": sum(tail) / len(tail),
        "stage1_s": stage1_s,
        "seconds": time.monotonic() - started,
    }


def _shared_prefix(sequences: Sequence[TokenSequence]) -> int:
    """Tokens every sequence starts with, stopping one short of the first target (a target at
    position t is predicted from position t - 1, which must run with the batch)."""
    first = sequences[0]
    n = min(len(s.ids) for s in sequences)
    for s in sequences[1:]:
        n = next((i for i in range(n) if s.ids[i] != first.ids[i]), n)
    earliest = min((s.targets.index(True) for s in sequences if True in s.targets), default=n)
    return max(0, min(n, earliest - 1))
