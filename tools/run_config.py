"""The configuration of ``gyre run``: one TOML file, typed on reading, recorded in the log.

``write_config`` writes the demo's configuration with a comment on every key, so a user
starts from a working run and edits it. A run records the TOML it ran with
(``run.configured``), so every process of the run (node agents on other machines too) and a
restarted ``gyre run`` read the same settings from the log.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import msgspec

from gyre_sched import PolicyKind, SchedConfig

Pos = Annotated[int, msgspec.Meta(ge=1)]
NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    init: str = "warm-start"
    max_context: Pos = 4096
    max_tokens: Pos = 160


class TrainConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    optimizer: str = "adamw"
    lr: Annotated[float, msgspec.Meta(gt=0)] = 5e-4
    max_grad_norm: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    jmax: Pos = 5
    micro_step_tokens: Pos = 4096
    scale_advantages: bool = True
    skip_zero_advantage: bool = True


class TaskConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    family: str = "copy-line"
    train: Pos = 64
    heldout: Pos = 32
    budget_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0


class EvalConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    heldout: bool = True


class RunConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    run_id: str = ""
    seed: int = 0
    steps: Pos = 10
    policy: str = "async"
    phi: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    mu: Pos = 1
    rho_min: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    tau_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    B: Pos = 4
    N: Pos = 4
    cells: Pos = 1
    rollout_engines: Pos = 2
    engine_capacity: Pos = 8
    nodes: Pos = 1
    harness: str = "builtin"
    run_dir: str = ""  # resolved when the run starts: its policies, workspaces and outputs
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    tasks: TaskConfig = msgspec.field(default_factory=TaskConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)

    @property
    def cells_move(self) -> bool:
        """Whether the policy moves cells between rollout and training (elastic, colocate): the
        cells are then elastic cells, each with a rollout engine of its own."""
        return self.sched().policy is not PolicyKind.ASYNC

    def sched(self) -> SchedConfig:
        """The decision core's config: the K trainer cells, the pool's capacity, the batch shape."""
        try:
            policy = PolicyKind(self.policy)
        except ValueError:
            raise ConfigFileError(
                f"policy must be one of {[p.value for p in PolicyKind]}, got {self.policy!r}"
            ) from None
        return SchedConfig(
            policy=policy,
            cells=self.cells,
            cell_capacity=self.engine_capacity,
            pool_capacity=self.rollout_engines * self.engine_capacity,
            group_size=self.N,
            batch_groups=self.B,
            phi=self.phi,
            mu=self.mu,
            rho_min=self.rho_min,
            tau_s=self.tau_s,
        ).validate()


class ConfigFileError(ValueError):
    """The run configuration cannot be read or is inconsistent."""


def parse_config(text: str, *, where: str = "the config", policy: str | None = None) -> RunConfig:
    """A ``RunConfig`` from TOML text (``policy``, when given, in place of the text's: the
    checks see the policy the run will have); raises ConfigFileError naming the bad key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{where} is not valid TOML: {exc}") from exc
    if policy is not None:
        raw["policy"] = policy
    try:
        config = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise ConfigFileError(f"{where}: {exc}") from exc
    if config.nodes > config.rollout_engines:
        raise ConfigFileError(
            f"{where}: nodes ({config.nodes}) cannot exceed rollout_engines ({config.rollout_engines})"
        )
    if config.steps % config.mu:
        raise ConfigFileError(
            f"{where}: steps ({config.steps}) must be a whole number of bursts of mu ({config.mu})"
        )
    if config.train.micro_step_tokens < config.model.max_context:
        # A trajectory row is a whole context, up to max_context tokens, and is never split: a
        # smaller budget would make the packer refuse the first group holding a long one.
        raise ConfigFileError(
            f"{where}: train.micro_step_tokens ({config.train.micro_step_tokens}) must be at least "
            f"model.max_context ({config.model.max_context}): a trajectory row is never split across micro-steps"
        )
    config.sched()  # the policy and the scheduler's shape are valid
    return config


def read_config(path: Path, *, policy: str | None = None) -> RunConfig:
    return parse_config(path.read_text(), where=str(path), policy=policy)


def to_toml(config: RunConfig) -> str:
    """The config as commented TOML (every key, its meaning, its value)."""
    c, m, t, k, e = config, config.model, config.train, config.tasks, config.eval
    return f'''# gyre run configuration. Every key is optional; these are the demo's values.
run_id = "{c.run_id}"          # empty: a new run id each time; the same id continues that run
seed = {c.seed}                # tasks, task order, sampling and admission draws follow it
steps = {c.steps}              # training steps (policy versions); a multiple of mu
policy = "{c.policy}"          # async: a fixed partition, rollout engines beside trainer cells; elastic: cells move between rollout and training by the waterlevel rule; colocate: all cells switch together
phi = {c.phi}                  # extra dispatch in units of B (boundary dispatch: Q_b = (phi + mu) B)
mu = {c.mu}                    # training steps per burst (one publication per burst)
rho_min = {c.rho_min}          # supply check: ready groups the batch still needs, as a fraction of B, before a cell joins training
tau_s = {c.tau_s}              # seconds the supply check must hold before a transition (the paper's tau)
B = {c.B}                      # rollout groups per training step
N = {c.N}                      # executions per group (advantages are group-relative)
cells = {c.cells}              # K cells (cell 0 is the core; the rest are satellites); under elastic and colocate each is also a rollout engine of engine_capacity (C_e)
rollout_engines = {c.rollout_engines}    # reference engines in the separate rollout pool
engine_capacity = {c.engine_capacity}    # concurrent executions per engine (C_s = rollout_engines x capacity)
nodes = {c.nodes}                # node agents gyre run starts here (engines spread over them; trainers on the first)
harness = "{c.harness}"        # builtin (the built-in agent) or claude-code
run_dir = "{c.run_dir}"           # empty: <data dir>/runs/<run id>; every machine must reach it

[model]
init = "{m.init}"      # warm-start: a tiny Qwen3 warm-started on generated demonstrations
                         # (made on first use, then cached); or a save_pretrained folder
max_context = {m.max_context}    # tokens an engine accepts
max_tokens = {m.max_tokens}      # tokens per model call

[train]
optimizer = "{t.optimizer}"   # adamw or sgd, the core's only optimizer
lr = {t.lr}
max_grad_norm = {t.max_grad_norm}   # global gradient-norm clip (0: none)
jmax = {t.jmax}                 # J_max: trajectories admitted per execution
micro_step_tokens = {t.micro_step_tokens}   # token budget of one packed micro-step (>= max_context: rows are never split)
scale_advantages = {str(t.scale_advantages).lower()}   # divide group-relative advantages by the group's std
skip_zero_advantage = {str(t.skip_zero_advantage).lower()}   # leave out rows whose advantage is 0 (their gradient is 0)

[tasks]
family = "{k.family}"  # the built-in task family (see `gyre tasks list`)
train = {k.train}               # training instances
heldout = {k.heldout}           # held-out instances, never trained on
budget_s = {k.budget_s}         # wall-clock budget of one execution

[eval]
heldout = {str(e.heldout).lower()}   # evaluate the held-out instances before the first and after the last step
'''


DEMO = RunConfig()
