"""A node's share of a live run, built from the run's recorded configuration and its log.

This machine's rollout engines (``--engines``) and the trainer cells it runs (``--trainers``:
all, or some, as cell numbers), resumed after the run's last publication. The node that runs
the core (cell 0) starts a world of trainer cells and records it in the log
(``trainer.world_started``: the rendezvous address, the queue keys, the step and policy it
resumes from); a node that runs satellites only joins the newest recorded world. Engines are named
``<run>:pool-<n>``, numbered from ``--engine-offset`` so that several nodes name theirs apart.
Under a policy that moves cells (elastic, colocate) the trainer cells are elastic cells, each
also hosting its rollout engine ``<run>:cell-<i>`` of ``engine_capacity`` executions. Every
engine is of the config's ``engine`` kind: the reference engine, or an SGLang server started
by ``tools/sglang_setup.sh serve``.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import uuid
from dataclasses import replace
from pathlib import Path

from gyre_proxy.engines import free_port, needs_advertise_host, reachable_host
from gyre_store import EventLog, EventMetadata, NewEvent, StreamId, TrainerWorldStarted, cell_engine_name
from gyre_tools.run_config import CORE_CELL, RunConfig, sglang_serve_command, trainer_cells
from gyre_tools.serve import group_source, packing
from gyre_train import InvalidConfigError
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchTraining, qwen3_spec
from gyre_train.cells import (
    CellConfig,
    ElasticConfig,
    LiveTraining,
    MegatronCells,
    NodePlan,
    QueueConfig,
    Resume,
    RolloutEngineConfig,
    TorchCells,
    TrainerPlan,
    resume_point,
)


def node_plan(
    log: EventLog,
    config: RunConfig,
    *,
    run_id: str,
    database_url: str,
    redis_url: str,
    engines: str,
    engine_offset: int,
    trainers: str,
    dist_port: int,
    host: str = "127.0.0.1",
    advertise_host: str | None = None,
    cell_metrics_port: int | None = None,
) -> NodePlan:
    run_dir = Path(config.run_dir)
    publish_dir = run_dir / "policies"
    initial = Path(config.model.init)
    count = config.rollout_engines if engines == "all" else 0 if engines == "none" else int(engines)

    def engine(name: str, cell_index: int, seed: int) -> RolloutEngineConfig:
        return RolloutEngineConfig(
            run_id=run_id,
            engine=name,
            cell_index=cell_index,
            capacity=config.engine_capacity,
            database_url=database_url,
            initial_model=initial,
            publish_dir=publish_dir,
            max_context=config.model.max_context,
            seed=seed,
            kind=config.engine,
            sglang_command=sglang_serve_command() if config.engine == "sglang" else (),
            log_dir=run_dir / "logs",
            host=host,
            advertise_host=advertise_host,
            device=config.engine_device,
        )

    engine_configs = tuple(
        engine(f"{run_id}:pool-{engine_offset + i}", -1, config.seed + engine_offset + i)
        for i in range(count)
    )
    here = trainer_cells(trainers, config.cells)
    if not here:
        return NodePlan(engines=engine_configs)
    if config.cells_move and len(here) < config.cells:
        raise InvalidConfigError(
            f"--trainers {trainers}: under policy {config.policy!r} the cells are also rollout engines "
            "and move between the roles together; they run on one machine (--trainers all)"
        )
    if needs_advertise_host(host, advertise_host):
        raise InvalidConfigError(f"--host {host!r} listens on every address: give --advertise-host too")
    address = reachable_host(host, advertise_host)
    state: Path | None = None  # the core's optimizer state at the publication it resumes from
    if CORE_CELL in here:
        resume = resume_point(log, run_id, config.mu, publish_dir)
        if resume.step >= config.steps:
            return NodePlan(engines=engine_configs)  # the run has trained every step
        world = _new_world(log, config, resume, run_id=run_id, address=address, dist_port=dist_port)
        state = resume.training_state
    else:
        world = newest_world(log, run_id)
        if world is None:
            return NodePlan(engines=engine_configs)  # no core yet: looked for again later
        if world.cells != config.cells:
            raise InvalidConfigError(
                f"the core's world has {world.cells} cells, the run's config {config.cells}"
            )
    training = LiveTraining(
        steps=config.steps,
        mu=config.mu,
        packing=packing(config),
        groups=group_source(config, run_id),
        publish=config.train.publish,
    )
    spec = ModelSpec(config={}, seed=config.seed, model_dir=Path(world.model_dir))
    t = config.train
    model: TorchCells | MegatronCells = TorchCells(
        spec, TorchTraining(t.shard, t.shard_ranks, t.dtype, t.activation_checkpointing, device=t.device)
    )
    if t.backend == "megatron":  # Megatron-core's GPTModel of the same Qwen3 folder, TP x PP ranks a cell
        megatron = qwen3_spec(
            Path(world.model_dir), seed=config.seed, max_sequence_length=t.micro_step_tokens
        )
        model = MegatronCells(megatron, t.tp, t.pp)
    optimizer = OptimizerConfig(
        kind=config.train.optimizer,
        lr=config.train.lr,
        max_grad_norm=config.train.max_grad_norm,
        state_path=state,
    )
    # gloo must talk on the interface others reach this machine at, once the world spans machines.
    interface = None if is_loopback(address) else interface_of(address)
    cells = tuple(
        CellConfig(
            run_id=run_id,
            cell=cell,
            cells=config.cells,
            redis_url=redis_url,
            dist_init=world.dist_init,
            # Queue keys of this world alone: a resumed trainer (or a run id used again on one
            # Redis) must never meet an earlier world's claims.
            queue=QueueConfig(prefix=world.queue_prefix, claim_timeout_s=30.0, poll_s=0.01),
            model=model,
            optimizer=optimizer,
            database_url=database_url,
            wait_timeout_s=600.0,
            dist_interface=interface,
            transport=world.transport,
            dist_backend=t.collectives,
            transport_host=address,
            metrics_port=_cell_metrics_port(cell_metrics_port, cell),
            metrics_host=host,
        )
        for cell in sorted(here)
    )
    # An FSDP or Megatron cell's other ranks: the same config at each position (they follow its leader).
    cells += tuple(replace(c, position=p) for p in range(1, model.ranks_per_cell) for c in cells)
    elastic, cell_engines = None, ()
    if config.cells_move:
        elastic = ElasticConfig(steps=config.steps, mu=config.mu)
        cell_engines = tuple(
            engine(cell_engine_name(run_id, cell), cell, config.seed + 1000 + cell)
            for cell in range(config.cells)
        )
    trainer_plan = TrainerPlan(
        cells,
        training,
        publish_dir,
        world.first_step,
        world.version,
        elastic=elastic,
        engines=cell_engines,
        world=world.world,
    )
    return NodePlan(engines=engine_configs, trainers=trainer_plan)


def _cell_metrics_port(base: int | None, cell: int) -> int | None:
    """Cell ``cell``'s metrics port: ``base`` plus its number; 0 (a free one) or None (none) as is."""
    return base if not base else base + cell


def newest_world(log: EventLog, run_id: str) -> TrainerWorldStarted | None:
    """The newest world of trainer cells run ``run_id``'s core started, or None before any."""
    worlds = [
        r.event
        for r in log.read_stream(StreamId("trainer", run_id))
        if isinstance(r.event, TrainerWorldStarted)
    ]
    return worlds[-1] if worlds else None


def _new_world(
    log: EventLog, config: RunConfig, resume: Resume, *, run_id: str, address: str, dist_port: int
) -> TrainerWorldStarted:
    """A new world of the run's trainer cells, resumed at ``resume`` and recorded for
    satellites elsewhere to join."""
    port = dist_port or free_port()
    world_id = f"from{resume.step}-{uuid.uuid4().hex[:8]}"
    host = f"[{address}]" if ":" in address else address
    world = TrainerWorldStarted(
        run_id=run_id,
        world=world_id,
        dist_init=f"tcp://{host}:{port}",
        queue_prefix=f"gyre:{run_id}:{world_id}",
        cells=config.cells,
        first_step=resume.step,
        version=resume.version,
        model_dir=str(resume.model_dir or Path(config.model.init)),
        node=socket.gethostname(),
        transport=config.train.weight_transport,
    )
    log.append([NewEvent(world, f"trainer-world:{run_id}:{world_id}", metadata=EventMetadata(run_id=run_id))])
    return world


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def interface_of(address: str) -> str:
    """The name of this machine's network interface that holds IPv4 ``address`` (or the address
    a host name resolves to)."""
    try:
        wanted = socket.gethostbyname(address)
    except OSError as exc:
        raise InvalidConfigError(f"cannot resolve the advertised address {address!r}: {exc}") from exc
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
        if socket.inet_ntoa(answer[20:24]) == wanted:
            return name
    raise InvalidConfigError(
        f"no network interface of this machine holds the advertised address {address!r} ({wanted}): "
        "the trainer cells on other machines could not reach this one"
    )
