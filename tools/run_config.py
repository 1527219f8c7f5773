"""The configuration of ``gyre run``: one TOML file, typed on reading, recorded in the log.

``write_config`` writes the demo's configuration with a comment on every key, so a user
starts from a working run and edits it. A run records the TOML it ran with
(``run.configured``), so every process of the run (node agents on other machines too) and a
restarted ``gyre run`` read the same settings from the log.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import msgspec

from gyre_proxy.harness import HarnessError, plugin_for
from gyre_sched import PolicyKind, SchedConfig
from gyre_train import GyreTrainError
from gyre_train.sandbox import KINDS as SANDBOX_KINDS
from gyre_train.tasks import open_source

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
    shard: str = "none"  # none or fsdp (SHARDS): the PyTorch backend's weights over a cell's ranks
    shard_ranks: Pos = 1  # processes per cell under fsdp (at least 2)
    dtype: str = "float32"  # float32 or bfloat16 compute, float32 master weights (DTYPES)
    activation_checkpointing: bool = False
    backend: str = "pytorch"  # pytorch or megatron (BACKENDS)
    tp: Pos = 1  # under megatron: tensor-parallel ranks per cell
    pp: Pos = 1  # under megatron: pipeline stages per cell
    scale_advantages: bool = True
    skip_zero_advantage: bool = True
    publish: str = "disk"  # disk, tensor or distributed (PUBLISH_METHODS)
    weight_transport: str = "torch"  # how joining satellites pull the core's weights (WEIGHT_TRANSPORTS)
    device: str = "cpu"  # cpu, cuda or cuda:N: where an unsharded PyTorch cell trains
    collectives: str = "gloo"  # gloo or nccl (COLLECTIVES): what the cells' torch.distributed world runs on

    @property
    def processes_per_cell(self) -> int:
        """Processes of one trainer cell: FSDP's ranks, Megatron's TP x PP, else one."""
        if self.shard == "fsdp":
            return self.shard_ranks
        return self.tp * self.pp if self.backend == "megatron" else 1


class TaskConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    source: str = ""  # "": builtin:<family>; else a folder of Harbor tasks or a .jsonl file
    family: str = "copy-line"
    train: Pos = 64
    heldout: Pos = 32
    budget_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    heldout_ids: list[str] = msgspec.field(default_factory=list)

    @property
    def spec(self) -> str:
        """The task source: ``source``, or the built-in ``family``."""
        return self.source or f"builtin:{self.family}"


class SandboxConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: str = "local"
    boot_concurrency: NonNeg = 16  # sandboxed executions started within 10 s of each other (0: no cap)
    boot_retries: NonNeg = 2  # starts again of a harness that died while booting
    # the total an execution's writable binds may hold, bwrap/podman/docker (0: no cap)
    disk_mb: NonNeg = 10240


class EvalConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    heldout: bool = True
    judge: str = ""  # "": none; "policy", "engine:NAME" or an http(s) URL: scores tasks with a rubric
    judge_model: str = ""  # the model name sent to a URL judge
    judge_key_env: str = ""  # the environment variable holding a URL judge's API key


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
    rollout_engines: NonNeg = 2
    engine_capacity: Pos = 8
    nodes: Pos = 1
    trainers: str = "all"  # trainer cells gyre run starts here; the rest join from other machines
    harness: str = "builtin"
    engine: str = "reference"  # the kind of engine node agents start: reference or sglang
    engine_device: str = "cpu"  # cpu, cuda or cuda:N: where a reference engine's weights and KV cache live
    external_engines: list[str] = msgspec.field(default_factory=list)  # "NAME=URL" or "NAME=URL@CAP"
    run_dir: str = ""  # resolved when the run starts: its policies, workspaces and outputs
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    tasks: TaskConfig = msgspec.field(default_factory=TaskConfig)
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)

    @property
    def externals(self) -> tuple[ExternalEngine, ...]:
        """The engines gyre does not start, parsed (``parse_config`` has checked them)."""
        return tuple(external_engine(spec, self.engine_capacity) for spec in self.external_engines)

    @property
    def pool_capacity(self) -> int:
        """C_s: the separate pool's engines that gyre starts, plus every external engine."""
        return self.rollout_engines * self.engine_capacity + sum(e.capacity for e in self.externals)

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
            pool_capacity=self.pool_capacity,
            group_size=self.N,
            batch_groups=self.B,
            phi=self.phi,
            mu=self.mu,
            rho_min=self.rho_min,
            tau_s=self.tau_s,
        ).validate()


class ConfigFileError(ValueError):
    """The run configuration cannot be read or is inconsistent."""


ENGINE_KINDS = ("reference", "sglang")
PUBLISH_METHODS = ("disk", "tensor", "distributed")
# gyre_train.cells.WEIGHT_TRANSPORTS, spelled here so that reading a config imports no torch
# (tests/unit/test_run_config.py checks that the two agree).
WEIGHT_TRANSPORTS = ("torch", "mooncake")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True, slots=True)
class ExternalEngine:
    """An engine gyre does not start (``external_engines``): registered as ``<run>:ext-<name>``."""

    name: str
    url: str
    capacity: int

    @property
    def on_this_machine(self) -> bool:
        return (urlsplit(self.url).hostname or "") in _LOOPBACK


def external_engine(spec: str, default_capacity: int) -> ExternalEngine:
    """``NAME=URL`` (capacity ``engine_capacity``) or ``NAME=URL@CAP``; raises ConfigFileError."""
    name, sep, rest = spec.partition("=")
    url, at, cap = rest.rpartition("@") if "@" in rest else (rest, "", "")
    problem = ""
    if not sep or not _NAME.match(name.strip()):
        problem = "NAME must be letters, digits, '.', '_' or '-' (at most 64)"
    elif urlsplit(url.strip()).scheme not in ("http", "https") or not urlsplit(url.strip()).hostname:
        problem = "URL must be http://HOST:PORT or https://HOST:PORT"
    elif at and not (cap.strip().isdigit() and int(cap) >= 1):
        problem = "CAP must be a whole number of executions, at least 1"
    if problem:
        raise ConfigFileError(f"external_engines entry {spec!r}: {problem} (form: NAME=URL or NAME=URL@CAP)")
    capacity = int(cap) if at else default_capacity
    return ExternalEngine(name.strip(), url.strip().rstrip("/"), capacity)


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
    if config.nodes > max(config.rollout_engines, 1):
        raise ConfigFileError(
            f"{where}: nodes ({config.nodes}) cannot exceed rollout_engines ({config.rollout_engines})"
        )
    _check_engines(config, where)
    _check_trainers(config, where)
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
    _check_harness(config, where)
    _check_tasks(config, where)
    _check_judge(config, where)
    _check_sharding(config, where)
    _check_backend(config, where)
    _check_devices(config, where)
    config.sched()  # the policy and the scheduler's shape are valid
    return config


CORE_CELL = 0  # the core among a run's trainer cells; the others are satellites


def trainer_cells(spec: str, cells: int, *, what: str = "--trainers") -> frozenset[int]:
    """The cells ``spec`` names: ``all``, ``none``, or numbers and ranges (``0``, ``1,3``,
    ``1-3``) of cells ``0`` .. ``cells - 1``; cell 0 is the core."""
    spec = spec.strip()
    if spec == "all":
        return frozenset(range(cells))
    if spec in ("none", ""):
        return frozenset()
    chosen: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ConfigFileError(
                f"{what} {spec!r}: all, none, or cell numbers such as 0, 1,2 or 1-3"
            ) from None
        if not 0 <= low <= high < cells:
            raise ConfigFileError(f"{what} {spec!r}: the run's cells are 0 to {cells - 1}")
        chosen.update(range(low, high + 1))
    return frozenset(chosen)


def _check_trainers(config: RunConfig, where: str) -> None:
    here = trainer_cells(config.trainers, config.cells, what=f"{where}: trainers")
    if CORE_CELL not in here:
        raise ConfigFileError(
            f"{where}: trainers ({config.trainers!r}) must hold the core, cell 0: gyre run runs it"
        )
    if config.cells_move and len(here) < config.cells:
        raise ConfigFileError(
            f'{where}: trainers ({config.trainers!r}) must be "all" under policy {config.policy!r}: '
            "cells that move between the roles run on one machine"
        )


# gyre_train.backends.pytorch's SHARDS and DTYPES, spelled here so that reading a config imports no torch
SHARDS = ("none", "fsdp")
DTYPES = ("float32", "bfloat16")


def _check_sharding(config: RunConfig, where: str) -> None:
    """``train.shard``, ``train.shard_ranks`` and ``train.dtype``: one line for each mistake."""
    t = config.train
    if t.shard not in SHARDS:
        raise ConfigFileError(f"{where}: train.shard must be one of {list(SHARDS)}, got {t.shard!r}")
    if t.dtype not in DTYPES:
        raise ConfigFileError(f"{where}: train.dtype must be one of {list(DTYPES)}, got {t.dtype!r}")
    if t.shard == "fsdp" and t.shard_ranks < 2:
        raise ConfigFileError(
            f'{where}: train.shard = "fsdp" needs train.shard_ranks of at least 2, got {t.shard_ranks} '
            "(a cell of one rank has nothing to shard over)"
        )
    if t.shard == "none" and t.shard_ranks != 1:
        raise ConfigFileError(
            f'{where}: train.shard_ranks ({t.shard_ranks}) applies to train.shard = "fsdp" only'
        )
    if t.shard == "fsdp" and config.cells_move:
        raise ConfigFileError(
            f'{where}: train.shard = "fsdp" needs policy "async": cells that move between rollout and '
            "training run one process each"
        )


COLLECTIVES = ("gloo", "nccl")


def _check_devices(config: RunConfig, where: str) -> None:
    """``train.device``, ``train.collectives`` and ``engine_device``: one line for each mistake."""
    t = config.train
    for key, name in (("train.device", t.device), ("engine_device", config.engine_device)):
        head, sep, index = name.partition(":")
        if name != "cpu" and not (head == "cuda" and (not sep or index.isdigit())):
            raise ConfigFileError(f"{where}: {key} must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if t.collectives not in COLLECTIVES:
        raise ConfigFileError(
            f"{where}: train.collectives must be one of {list(COLLECTIVES)}, got {t.collectives!r}"
        )
    if t.device != "cpu" and (t.backend != "pytorch" or t.shard != "none"):
        raise ConfigFileError(
            f'{where}: train.device = "{t.device}" trains unsharded PyTorch cells only; fsdp and '
            "megatron cells train on the CPU (their GPU path is not built)"
        )
    if t.collectives == "nccl" and t.device == "cpu":
        raise ConfigFileError(
            f'{where}: train.collectives = "nccl" moves CUDA tensors: set train.device = "cuda"'
        )
    if config.engine_device != "cpu" and config.engine != "reference":
        raise ConfigFileError(
            f"{where}: engine_device places the reference engine; an {config.engine} engine takes "
            "its device from its own command"
        )


BACKENDS = ("pytorch", "megatron")


def _check_backend(config: RunConfig, where: str) -> None:
    """``train.backend``, ``train.tp`` and ``train.pp``: one line for each mistake."""
    t = config.train
    if t.backend not in BACKENDS:
        raise ConfigFileError(f"{where}: train.backend must be one of {list(BACKENDS)}, got {t.backend!r}")
    if t.backend == "pytorch":
        if t.tp != 1 or t.pp != 1:
            raise ConfigFileError(f'{where}: train.tp and train.pp apply to train.backend = "megatron" only')
        return
    if t.shard != "none" or t.dtype != "float32" or t.activation_checkpointing:
        raise ConfigFileError(
            f'{where}: train.backend = "megatron" trains float32, sharded by train.tp and train.pp: '
            "train.shard, train.dtype and train.activation_checkpointing are the PyTorch backend's"
        )
    if config.cells_move:
        raise ConfigFileError(
            f'{where}: train.backend = "megatron" needs policy "async": cells that move between rollout '
            "and training run one process each"
        )


def _check_harness(config: RunConfig, where: str) -> None:
    """A known harness whose first request, and one answer, fit in ``model.max_context``."""
    try:
        plugin = plugin_for(config.harness)
    except HarnessError as exc:
        raise ConfigFileError(f"{where}: harness: {exc}") from None
    needed = plugin.first_request_tokens + config.model.max_tokens
    if plugin.first_request_tokens and config.model.max_context < needed:
        raise ConfigFileError(
            f"{where}: model.max_context ({config.model.max_context}) is too small for harness "
            f"{plugin.name!r}: its first request takes about {plugin.first_request_tokens} tokens, so it needs "
            f"at least {needed} (that plus model.max_tokens = {config.model.max_tokens})"
        )


def _check_tasks(config: RunConfig, where: str) -> None:
    """A known sandbox kind, and a task source it can run (read here: bad input is one line)."""
    kind = config.sandbox.kind
    if kind not in SANDBOX_KINDS:
        raise ConfigFileError(f"{where}: sandbox.kind must be one of {list(SANDBOX_KINDS)}, got {kind!r}")
    spec = config.tasks.spec
    if spec.startswith("builtin:"):
        if config.tasks.heldout_ids:
            raise ConfigFileError(f"{where}: tasks.heldout_ids applies to a folder or .jsonl source only")
        return
    try:
        source = open_source(spec)
    except GyreTrainError as exc:
        raise ConfigFileError(f"{where}: tasks.source: {exc}") from None
    if kind == "local" and any(t.fixed_paths for t in source.tasks):
        raise ConfigFileError(
            f"{where}: tasks.source {spec} holds Harbor tasks, whose tests use absolute paths (/tests, "
            f"/logs/verifier, the workspace's WORKDIR) that the local sandbox cannot provide: set "
            f'[sandbox] kind = "bwrap" (or "podman", "docker")'
        )


def judge_engine(config: RunConfig, name: str) -> str | None:
    """The log's name of the run's engine ``name`` (``eval.judge = "engine:NAME"``): an
    external engine's ``<run>:ext-NAME``, a pool engine ``pool-<n>``'s ``<run>:pool-<n>``;
    None when the run has no engine of that name."""
    if name in {e.name for e in config.externals}:
        return f"{config.run_id}:ext-{name}"
    pool = re.fullmatch(r"pool-(\d+)", name)
    if pool is not None and int(pool.group(1)) < config.rollout_engines:
        return f"{config.run_id}:{name}"
    return None


def _check_judge(config: RunConfig, where: str) -> None:
    """``eval.judge``: none, ``policy``, ``engine:NAME`` naming an engine of the run, or an
    OpenAI-compatible URL with a model."""
    judge = config.eval.judge
    if judge in ("", "policy"):
        return
    if judge.startswith("engine:"):
        name = judge.removeprefix("engine:")
        if judge_engine(config, name) is None:
            known = [e.name for e in config.externals] + [f"pool-{n}" for n in range(config.rollout_engines)]
            raise ConfigFileError(
                f"{where}: eval.judge = {judge!r}: the run has no engine {name!r} (its engines: "
                f"{', '.join(known) or 'none'}; a judge on another model is a URL)"
            )
        return
    parts = urlsplit(judge)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigFileError(
            f'{where}: eval.judge must be "", "policy", "engine:NAME" or an http(s) URL, got {judge!r}'
        )
    if not config.eval.judge_model:
        raise ConfigFileError(f"{where}: eval.judge_model: a URL judge needs the model name to ask for")


def _check_engines(config: RunConfig, where: str) -> None:
    """The engine keys: known values, external engines that the chosen publication reaches."""
    if config.engine not in ENGINE_KINDS:
        raise ConfigFileError(f"{where}: engine must be one of {list(ENGINE_KINDS)}, got {config.engine!r}")
    if config.train.publish not in PUBLISH_METHODS:
        raise ConfigFileError(
            f"{where}: train.publish must be one of {list(PUBLISH_METHODS)}, got {config.train.publish!r}"
        )
    if config.train.weight_transport not in WEIGHT_TRANSPORTS:
        raise ConfigFileError(
            f"{where}: train.weight_transport must be one of {list(WEIGHT_TRANSPORTS)}, "
            f"got {config.train.weight_transport!r}"
        )
    t = config.train
    ranks = t.processes_per_cell
    if t.weight_transport == "mooncake" and ranks > 1:
        raise ConfigFileError(
            f'{where}: train.weight_transport = "mooncake" pulls one flat snapshot per cell; a cell of '
            f'{ranks} processes (train.shard, or train.tp x train.pp) takes its weights with "torch"'
        )
    externals = config.externals  # each entry checked
    names = [e.name for e in externals]
    if len(set(names)) != len(names):
        raise ConfigFileError(f"{where}: external_engines names must be unique, got {names}")
    if config.rollout_engines == 0 and not externals and config.policy == "async":
        raise ConfigFileError(
            f"{where}: rollout_engines = 0 leaves the async policy no rollout engine: "
            "start some, or name external_engines"
        )
    far = [e for e in externals if not e.on_this_machine]
    if far and config.train.publish == "tensor":
        # SGLang takes tensors in the request as handles to this machine's shared memory.
        raise ConfigFileError(
            f'{where}: train.publish = "tensor" reaches only engines on this machine, and external '
            f'engine {far[0].name} is at {far[0].url}: use "disk" (a run_dir it reads at the same '
            'path) or "distributed"'
        )
    if far and config.train.publish == "distributed":
        # The trainer's end of the broadcast group listens on 127.0.0.1 (EnginePublisherConfig).
        raise ConfigFileError(
            f'{where}: train.publish = "distributed" opens its group on 127.0.0.1, which external '
            f'engine {far[0].name} at {far[0].url} cannot join: use "disk" (a run_dir it reads '
            "at the same path)"
        )


SGLANG_SETUP = Path(__file__).with_name("sglang_setup.sh")


def sglang_serve_command() -> tuple[str, ...]:
    """What starts an SGLang server: ``tools/sglang_setup.sh serve`` (its environment's python,
    the CPU workarounds), given ``DIR PORT [launch_server options]``."""
    return ("bash", str(SGLANG_SETUP), "serve")


def sglang_missing() -> str | None:
    """Why SGLang's environment cannot start engines here (how to build it), or None."""
    try:
        done = subprocess.run(
            ["bash", str(SGLANG_SETUP), "python"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {SGLANG_SETUP}: {exc}"
    return None if done.returncode == 0 else done.stderr.strip() or f"{SGLANG_SETUP} python failed"


def check_environment(config: RunConfig) -> None:
    """What the config needs from this machine, checked before anything starts: SGLang's
    environment for ``engine = "sglang"``. Raises ConfigFileError saying how to get it."""
    if config.engine == "sglang" and (config.rollout_engines or config.cells_move):
        missing = sglang_missing()
        if missing:
            raise ConfigFileError(f'engine = "sglang" needs SGLang: {missing}')


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
rollout_engines = {c.rollout_engines}    # engines gyre starts in the separate rollout pool (0: external_engines only)
engine_capacity = {c.engine_capacity}    # concurrent executions per engine (C_s = rollout_engines x capacity + external capacities)
engine = "{c.engine}"    # reference (gyre's own engine) or sglang (python -m sglang.launch_server, from tools/sglang_setup.sh's environment)
engine_device = "{c.engine_device}"   # cpu, cuda or cuda:N: where the reference engines' weights and KV caches live (sampling stays on the CPU)
external_engines = {json.dumps(c.external_engines)}    # engines gyre does not start, each "NAME=URL" (capacity engine_capacity) or "NAME=URL@CAP"; they get every publication
nodes = {c.nodes}                # node agents gyre run starts here (engines spread over them; trainers on the first)
trainers = "{c.trainers}"         # trainer cells gyre run starts (on its first node): all, or cell numbers with the core, 0 (e.g. "0"); the others run in `gyre node serve --trainers 1-3` on other machines
harness = "{c.harness}"        # builtin (the built-in agent), claude-code or codex (their first request needs max_context >= about 12,000 and 9,000 + max_tokens)
run_dir = "{c.run_dir}"           # empty: <data dir>/runs/<run id>; every machine must reach it

[model]
init = "{m.init}"      # warm-start: a tiny Qwen3 warm-started on generated demonstrations
                         # (made on first use, then cached); or a save_pretrained folder
max_context = {m.max_context}    # tokens an engine accepts
max_tokens = {m.max_tokens}      # the most tokens one model call generates: the built-in agent asks for it, the proxy caps any harness's request at it

[train]
optimizer = "{t.optimizer}"   # adamw or sgd, the core's only optimizer
lr = {t.lr}
max_grad_norm = {t.max_grad_norm}   # global gradient-norm clip (0: none)
jmax = {t.jmax}                 # J_max: trajectories admitted per execution
micro_step_tokens = {t.micro_step_tokens}   # token budget of one packed micro-step (>= max_context: rows are never split)
shard = "{t.shard}"   # none (each cell process holds the whole model) or fsdp (FSDP2: each of a cell's shard_ranks processes holds 1/shard_ranks of the weights, gradients and optimizer state)
shard_ranks = {t.shard_ranks}   # processes per trainer cell under shard = "fsdp" (at least 2); 1 otherwise
dtype = "{t.dtype}"   # float32 or bfloat16: the compute dtype of forward and backward; the optimizer always steps float32 weights
activation_checkpointing = {str(t.activation_checkpointing).lower()}   # recompute each decoder layer's activations in backward (less memory, about one more forward)
backend = "{t.backend}"   # pytorch (the Hugging Face model) or megatron (Megatron-core's GPTModel of model.init's Qwen3 checkpoint, published back as Qwen3)
tp = {t.tp}   # under backend = "megatron": tensor-parallel ranks per trainer cell (each cell runs tp * pp processes)
pp = {t.pp}   # under backend = "megatron": pipeline stages per trainer cell (1 with tied embeddings, as the warm start's)
scale_advantages = {str(t.scale_advantages).lower()}   # divide group-relative advantages by the group's std
skip_zero_advantage = {str(t.skip_zero_advantage).lower()}   # leave out rows whose advantage is 0 (their gradient is 0)
publish = "{t.publish}"   # how the core's weights reach every engine at once: disk (a folder under run_dir), tensor (in the request; engines on this machine) or distributed (a gloo broadcast group)
weight_transport = "{t.weight_transport}"   # how a satellite joining a batch pulls the core's weights: torch (the core sends them between micro-steps) or mooncake (read from the core's memory by Mooncake Transfer Engine, at the machine's advertised address)
device = "{t.device}"   # cpu, cuda or cuda:N: where each unsharded PyTorch cell trains ("cuda": a machine's GPUs taken round-robin by the cells' ranks)
collectives = "{t.collectives}"   # gloo (host tensors; cells may share a GPU) or nccl (CUDA tensors; one GPU per cell process, device = "cuda")

[tasks]
source = "{k.source}"    # empty: the built-in family below; or a folder of Harbor task directories, or a .jsonl file (`gyre tasks list SOURCE`)
family = "{k.family}"  # the built-in task family (and the warm start's demonstrations)
train = {k.train}               # training instances of a built-in family
heldout = {k.heldout}           # held-out instances of a built-in family, never trained on
budget_s = {k.budget_s}         # wall-clock budget of one execution of a built-in family (a sourced task: its own agent timeout)
heldout_ids = {json.dumps(k.heldout_ids)}        # a sourced task set: these task ids are held out (besides the source's own split)

[sandbox]
kind = "{config.sandbox.kind}"   # where harnesses and tests run: local (the host: isolates nothing), bwrap, podman or docker (docs/sandboxes.md)
boot_concurrency = {config.sandbox.boot_concurrency}  # sandboxed executions booting at once (started less than 10 s ago); 0: no cap; local: never capped
boot_retries = {config.sandbox.boot_retries}       # a harness that exits non-zero within 10 s of its start is started again, this many times, within its budget
disk_mb = {config.sandbox.disk_mb}        # the most an execution's workspace, home and snapshots may hold together, in MB (bwrap, podman, docker: a file system of that size; a write past it fails, the harness goes on); 0: no cap; local: never capped

[eval]
heldout = {str(e.heldout).lower()}   # evaluate the held-out instances before the first and after the last step
judge = "{e.judge}"         # empty: tests only; "policy" (the run's own policy, through its proxy), "engine:NAME" (one engine of the run: pool-<n> or an external engine's NAME) or an OpenAI-compatible URL: an LLM judge scores the tasks that have a rubric, instead of their tests (docs/judge.md)
judge_model = "{e.judge_model}"   # the model a URL judge is asked for
judge_key_env = "{e.judge_key_env}" # the environment variable holding a URL judge's API key (read by the evaluator process)
'''


DEMO = RunConfig()
