"""What every streamed update must equal, with tolerances derived from float32 rounding.

Cells compute the same per-micro-step gradients g_m as one process (same parameters, same
micro-step, same kernels) and only sum them in another order: each cell its own claims, then
the reduction over the prefix. Any order of summing M float32 vectors lands within
gamma_{M-1} * sum_m |g_m| of the exact sum, element by element (u = 2^-24, gamma_n = n u / (1 - n u)),
so the checks here recompute the g_m at the parameters the core held before each update and
compare the gradient it applied, its recorded `loss` and `grad_norm`, and the parameters after it
against float64 sums, within bounds computed from the same g_m. The loss is also checked against
the paper's equation (6) computed from the micro-steps' tokens alone (not their coefficients), so
a wrong normalization shared by cells and reference fails too. PyTorch backend only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gyre_store.catalog import TrainingUpdate
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend
from gyre_train.cells import ExecutionTotals, gradient_share, merge_shares, ratio_share, train_batch_locally
from gyre_train.objective import LossConfig
from gyre_train.trajectories import MicroStep

U = 2.0**-24  # float32 unit roundoff
Batch = tuple[list[MicroStep], tuple[ExecutionTotals, ...]]


def gamma(n: int) -> float:
    """Relative error bound of n float32 roundings (Higham's gamma_n)."""
    return n * U / (1 - n * U)


@dataclass(frozen=True)
class BatchReference:
    """One batch at given parameters, in float64 from the per-micro-step pieces.

    gradient, bound: [numel]; the batch gradient sum_m g_m and gamma_{M-1} sum_m |g_m|, the most
    any float32 summation order of the g_m may differ from it. loss: sum_m l_m; loss_abs: sum_m |l_m|.
    paper_loss, paper_abs: equation (6) from the tokens and sum |c_u l_u| (see `paper_loss`).
    """

    gradient: torch.Tensor
    bound: torch.Tensor
    loss: float
    loss_abs: float
    paper_loss: float
    paper_abs: float
    micro_steps: int
    longest: int  # the most targets in one micro-step

    def loss_bound(self, cells: int) -> float:
        """How far a loss reduced over `cells` may be from `loss`: each cell's share is rounded to
        float32 for the reduction, then the cells' shares are summed in float32 (gamma_K)."""
        return (gamma(cells) + self.micro_steps * 2.0**-53) * self.loss_abs

    def norm_bound(self) -> float:
        """How far a float32 norm of a gradient within `bound` may be from the exact norm: the
        bound's own norm, plus the rounding of numel squares summed (gamma_numel, relative)."""
        norm = float(self.gradient.norm())
        return float(self.bound.norm()) + gamma(self.gradient.numel()) * norm

    def paper_bound(self, cells: int) -> float:
        """How far the recorded loss may be from equation (6): each token term c_u l_u passes
        through at most 8 float32 roundings (the casts of c_u and A_i, the log-ratio, exp, three
        products, the cap), a micro-step sums up to `longest` of them, and cells sum K shares."""
        return gamma(self.longest + cells + 8) * self.paper_abs


def paper_loss(
    backend: TorchBackend,
    steps: Sequence[MicroStep],
    executions: Sequence[ExecutionTotals],
    config: LossConfig,
) -> tuple[float, float]:
    """Equation (6) at the backend's parameters, in float64: (loss, sum_u |c_u l_u|).

    L = 1/(B N) sum_i 1/L_i sum_{u in T_i} min(cap, -m_i min(rho_u, 5) A_i log pi(y_u)), with B N the
    number of executions in the batch and L_i counted from the target masks: the micro-steps'
    coefficients are not used, so a wrong 1/(L_i B N) in the packer shows here.
    """
    advantage = {e.execution_id: e.advantage for e in executions}
    per_execution: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # (logp, logp_roll) pieces
    for step in steps:
        logp = backend.logprobs(step, grad=False).double()  # [T]
        mask = torch.from_numpy(step.target_mask.copy())  # [T]
        roll = torch.from_numpy(step.behaviour_logprobs.astype("float64"))  # [T]
        slots = torch.from_numpy(step.slots.astype("int64"))  # [T]
        for slot, execution_id in enumerate(step.execution_ids):
            mine = mask & (slots == slot)  # [T] this execution's targets
            per_execution.setdefault(execution_id, []).append((logp[mine], roll[mine]))
    total, absolute = 0.0, 0.0
    raw_executions = len(executions)  # B N: every execution of the batch, with targets or not
    for execution_id, parts in per_execution.items():
        logp = torch.cat([p for p, _ in parts])  # [L_i]
        roll = torch.cat([r for _, r in parts])  # [L_i]
        count = int(logp.numel())  # L_i
        if count == 0:
            continue
        a = advantage[execution_id]
        s = float(torch.exp((logp - roll).mean()))  # eq. (5)
        m = 0.0 if (a > 0 and s > config.clip_high) or (a < 0 and s < config.clip_low) else 1.0
        rho = torch.exp(logp - roll).clamp(max=config.token_ratio_cap)
        terms = (-m * rho * a * logp).clamp(max=config.token_loss_cap) / (count * raw_executions)
        total += float(terms.sum())
        absolute += float(terms.abs().sum())
    return total, absolute


def batch_reference(
    backend: TorchBackend,
    steps: Sequence[MicroStep],
    executions: Sequence[ExecutionTotals],
    config: LossConfig,
) -> BatchReference:
    """The batch at `backend`'s parameters, micro-step by micro-step (its gradients are zeroed)."""
    clip = merge_shares((ratio_share(backend, s) for s in steps), executions, config)
    gradient = torch.zeros(backend.numel, dtype=torch.float64)
    absolute = torch.zeros(backend.numel, dtype=torch.float64)
    losses = []
    for step in steps:
        backend.zero_gradients()
        losses.append(gradient_share(backend, step, clip, config))
        g = backend.flat_gradients().double()  # [numel] g_m
        gradient += g
        absolute += g.abs()
    backend.zero_gradients()
    paper, paper_abs = paper_loss(backend, steps, executions, config)
    return BatchReference(
        gradient=gradient,
        # (plus the float64 roundings of the reference sum itself)
        bound=(gamma(len(steps) - 1) + len(steps) * 2.0**-53) * absolute,
        loss=sum(losses),
        loss_abs=sum(abs(v) for v in losses),
        paper_loss=paper,
        paper_abs=paper_abs,
        micro_steps=len(steps),
        longest=max(int(s.target_mask.sum()) for s in steps),
    )


def assert_within(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """|got - expected| <= bound element by element, or an error naming the worst element."""
    excess = (got.double() - expected).abs() - bound
    if bool((excess > 0).any()):
        i = int(excess.argmax())
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} of {excess.numel()} values outside the bound; worst at "
            f"{i}: got {float(got[i]):.9g}, expected {float(expected[i]):.9g}, bound {float(bound[i]):.3g}"
        )


def adamw_first_step_bound(
    reference: BatchReference, parameters: torch.Tensor, optimizer: OptimizerConfig
) -> torch.Tensor:
    """[numel] how far one unclipped AdamW step from `parameters` may move on two gradients that
    are each within `reference.bound` of `reference.gradient`.

    AdamW's first step is lr * g / (|g| + eps) (bias corrected, no weight decay), whose slope in g
    is lr * eps / (|g| + eps)^2: up to lr / eps = 1e6 * lr where the batch gradient cancels to
    about 0, so there a summation-order difference of 1e-12 moves a weight by lr * 1e-4 (the
    1.2e-6 once seen in CI with lr 1e-2). Elsewhere the slope is tiny. The bound takes the
    steepest slope within reach and adds the step's own roundings (about 8 of lr, one of |p|).
    """
    eps = 1e-8  # torch's AdamW default, which make_optimizer keeps
    nearest = (reference.gradient.abs() - reference.bound).clamp(min=0)  # [numel] smallest |g| in reach
    slope = optimizer.lr * eps / (nearest + eps) ** 2  # [numel]
    return slope * 2 * reference.bound + 16 * U * optimizer.lr + 2 * U * parameters.double().abs()


def check_updates(
    output: Path,
    spec: ModelSpec,
    optimizer: OptimizerConfig,
    batches: Sequence[Batch],
    updates: Sequence[TrainingUpdate],
    config: LossConfig | None = None,
) -> None:
    """Every update the core wrote to `output` (grads-v<k>.pt, params-v<k>.pt) and recorded
    (`updates`, in order) equals one process training `batches` in turn.

    Per update, at the parameters the core held before it: the applied gradient within the
    summation-order bound of the batch gradient; `loss` within the reduction's rounding of the
    sum of the micro-step losses and of equation (6); `grad_norm` within the gradient bound's norm
    of the batch gradient's norm. The core's optimizer replayed on the applied gradients gives its
    parameters and norms bit for bit. Against one process training from the start on its own
    (`train_batch_locally`): every update's loss and norm, with SGD every update's parameters, the bound summed over the updates
    with the rounding of each step and the computed effect of earlier differences on the next
    gradient; with AdamW the first update's parameters (`adamw_first_step_bound`).
    """
    assert len(updates) == len(batches)
    config = config or LossConfig()
    probe = TorchBackend(spec)  # per-micro-step gradients at the core's parameters
    replay = TorchBackend(spec, optimizer)  # the core's optimizer on the core's gradients
    alone = TorchBackend(spec, optimizer)  # one process, on its own from the start
    before = replay.flat_parameters()
    drift = torch.zeros(probe.numel, dtype=torch.float64)  # SGD: how far `alone` may be
    for version, ((steps, executions), update) in enumerate(zip(batches, updates, strict=True), start=1):
        applied = torch.load(output / f"grads-v{version}.pt")
        after = torch.load(output / f"params-v{version}.pt")
        probe.load_flat_parameters(before)
        ref = batch_reference(probe, steps, executions, config)
        assert float(ref.gradient.abs().max()) > 1e3 * float(ref.bound.max())  # the check can see a bug
        assert_within(applied, ref.gradient, ref.bound, f"v{version} reduced gradient")
        cells = len(update.cells)
        assert abs(update.loss - ref.loss) <= ref.loss_bound(cells), (version, update.loss, ref.loss)
        paper = ref.paper_loss
        assert abs(update.loss - paper) <= ref.paper_bound(cells), (version, update.loss, paper)
        norm = float(ref.gradient.norm())
        assert abs(update.grad_norm - norm) <= ref.norm_bound(), (version, update.grad_norm, norm)

        assert replay.apply_update(applied) == update.grad_norm
        assert torch.equal(replay.flat_parameters(), after), f"v{version} parameters"

        alone_before = alone.flat_parameters()
        probe.load_flat_parameters(alone_before)
        own = batch_reference(probe, steps, executions, config)  # equals `ref` at v1
        local = train_batch_locally(alone, steps, executions, config)
        # The single process's loss and norm: at v1 its parameters are the core's; later they differ
        # by the drift below, whose effect on the exact loss and norm is computed (own - ref).
        moved_loss = abs(own.loss - ref.loss) + own.loss_bound(1)
        assert abs(update.loss - local.loss) <= ref.loss_bound(cells) + moved_loss, (version, local.loss)
        moved_norm = abs(float(own.gradient.norm()) - norm) + own.norm_bound()
        assert abs(update.grad_norm - local.grad_norm) <= ref.norm_bound() + moved_norm, (version, local)
        expected = alone.flat_parameters()
        assert float((expected - alone_before).abs().max()) > 1e-4  # the update moved the weights
        if optimizer.kind == "sgd":
            assert optimizer.max_grad_norm == 0 and optimizer.weight_decay == 0  # p - lr g, nothing else
            # p_k - p'_k = p_{k-1} - p'_{k-1} - lr (g_k - g'_k) + roundings, and g_k - g'_k is the two
            # summation errors plus the exact gradients' difference at the two parameter vectors.
            drift += optimizer.lr * (ref.bound + own.bound + (ref.gradient - own.gradient).abs())
            drift += 2 * U * (after.double().abs() + expected.double().abs())
            assert_within(after, expected.double(), drift, f"v{version} parameters after SGD")
        elif version == 1:
            # The bound is for g / (|g| + eps) itself: no clip at work, no decay.
            assert not 0 < optimizer.max_grad_norm <= 2 * norm and optimizer.weight_decay == 0
            assert_within(
                after, expected.double(), adamw_first_step_bound(ref, before, optimizer), "v1 after AdamW"
            )
        before = after
