"""A node's share of a live run, built from the run's recorded configuration and its log.

This machine's rollout engines (``--engines``) and, when it runs them, every trainer cell
(``--trainers all``), resumed after the run's last publication. Engines are named
``<run>:pool-<n>``, numbered from ``--engine-offset`` so that several nodes name theirs apart.
Under a policy that moves cells (elastic, colocate) the trainer cells are elastic cells, each
also hosting its rollout engine ``<run>:cell-<i>`` of ``engine_capacity`` executions. Every
engine is of the config's ``engine`` kind: the reference engine, or an SGLang server started
by ``tools/sglang_setup.sh serve``.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from gyre_proxy.engines import free_port
from gyre_store import EventLog, cell_engine_name
from gyre_tools.run_config import RunConfig, sglang_serve_command
from gyre_tools.serve import group_source, packing
from gyre_train.backends import ModelSpec, OptimizerConfig
from gyre_train.cells import (
    CellConfig,
    ElasticConfig,
    LiveTraining,
    NodePlan,
    QueueConfig,
    RolloutEngineConfig,
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
        )

    engine_configs = tuple(
        engine(f"{run_id}:pool-{engine_offset + i}", -1, config.seed + engine_offset + i)
        for i in range(count)
    )
    trainer_plan = None
    if trainers == "all":
        training = LiveTraining(
            steps=config.steps,
            mu=config.mu,
            packing=packing(config),
            groups=group_source(config, run_id),
            publish=config.train.publish,
        )
        resume = resume_point(log, run_id, config.mu, publish_dir)
        if resume.step < config.steps:
            spec = ModelSpec(config={}, seed=config.seed, model_dir=resume.model_dir or initial)
            optimizer = OptimizerConfig(
                kind=config.train.optimizer,
                lr=config.train.lr,
                max_grad_norm=config.train.max_grad_norm,
                state_path=resume.training_state,  # the moments at the last publication, when kept
            )
            port = dist_port or free_port()
            # Queue keys of this incarnation of the trainer alone: a resumed trainer (or a run id
            # used again on one Redis) must never meet an earlier incarnation's claims.
            incarnation = f"from{resume.step}-{uuid.uuid4().hex[:8]}"
            cells = tuple(
                CellConfig(
                    run_id=run_id,
                    cell=cell,
                    cells=config.cells,
                    redis_url=redis_url,
                    dist_init=f"tcp://127.0.0.1:{port}",
                    queue=QueueConfig(
                        prefix=f"gyre:{run_id}:{incarnation}", claim_timeout_s=30.0, poll_s=0.01
                    ),
                    model=spec,
                    optimizer=optimizer,
                    database_url=database_url,
                    wait_timeout_s=600.0,
                )
                for cell in range(config.cells)
            )
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
                resume.step,
                resume.version,
                elastic=elastic,
                engines=cell_engines,
            )
    return NodePlan(engines=engine_configs, trainers=trainer_plan)
