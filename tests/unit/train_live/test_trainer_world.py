"""Trainer cells on several machines: which cells a node runs, the world the core's node records,
and the satellites elsewhere that join it (and each newer one)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre_store import InMemoryEventLog, StreamId, TrainerWorldStarted
from gyre_tools.node_plan import interface_of, newest_world, node_plan
from gyre_tools.run_config import DEMO, ConfigFileError, RunConfig, parse_config, trainer_cells
from gyre_tools.serve import Trainers
from gyre_train.cells import LiveTraining, NodeAgent, NodePlan, TrainerPlan
from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories import PackingConfig

ASYNC = msgspec.structs.replace(DEMO, policy="async", cells=3)


def _plan(log: InMemoryEventLog, config: RunConfig, trainers: str, **where: str | None) -> NodePlan:
    return node_plan(
        log, config, run_id="r", database_url="", redis_url="redis://x", engines="none",
        engine_offset=0, trainers=trainers, dist_port=29555, **where,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "cells"),
    [
        ("all", {0, 1, 2, 3}),
        ("none", set()),
        ("0", {0}),
        ("1,3", {1, 3}),
        ("1-3", {1, 2, 3}),
        ("0, 2-3", {0, 2, 3}),
    ],
)
def test_trainers_names_all_none_or_cell_numbers(spec: str, cells: set[int]) -> None:
    assert trainer_cells(spec, 4) == cells


@pytest.mark.parametrize(
    ("spec", "why"), [("4", "cells are 0 to 3"), ("2-1", "cells are 0 to 3"), ("x", "cell numbers")]
)
def test_a_bad_trainers_value_says_what_is_allowed(spec: str, why: str) -> None:
    with pytest.raises(ConfigFileError, match=why):
        trainer_cells(spec, 4)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('cells = 2\ntrainers = "1"', "must hold the core"),
        ('cells = 2\ntrainers = "0-2"', "cells are 0 to 1"),
        ('policy = "elastic"\ncells = 2\ntrainers = "0"\nrollout_engines = 0', 'must be "all" under policy'),
    ],
)
def test_a_runs_trainers_hold_the_core_and_keep_moving_cells_together(text: str, why: str) -> None:
    with pytest.raises(ConfigFileError, match=why):
        parse_config(text)
    assert parse_config('cells = 3\ntrainers = "0,2"').trainers == "0,2"


def test_the_cores_node_records_its_world_and_satellites_elsewhere_join_the_newest(tmp_path: Path) -> None:
    config = msgspec.structs.replace(ASYNC, run_dir=str(tmp_path))
    log = InMemoryEventLog()
    assert _plan(log, config, "1-2").trainers is None  # no core yet: nothing to join
    core = _plan(log, config, "0", host="0.0.0.0", advertise_host="127.0.0.1").trainers
    assert core is not None and [c.cell for c in core.cells] == [0]
    world = newest_world(log, "r")
    assert world is not None and world.world == core.world
    assert (world.dist_init, world.cells, world.first_step, world.version) == (
        "tcp://127.0.0.1:29555",
        3,
        0,
        0,
    )
    satellites = _plan(log, config, "1-2").trainers
    assert satellites is not None and [c.cell for c in satellites.cells] == [1, 2]
    assert satellites.world == core.world
    assert {c.dist_init for c in (*core.cells, *satellites.cells)} == {world.dist_init}
    assert {c.queue.prefix for c in (*core.cells, *satellites.cells)} == {world.queue_prefix}
    assert core.cells[0].dist_interface is None  # loopback: gloo's own choice is right
    # A core started again starts a new world, with keys of its own; satellites follow it.
    again = _plan(log, config, "0").trainers
    assert again is not None and again.world != core.world
    assert again.cells[0].queue.prefix != core.cells[0].queue.prefix
    followed = _plan(log, config, "2").trainers
    assert followed is not None and followed.world == again.world
    assert [e.event.world for e in log.read_stream(StreamId("trainer", "r"))] == [core.world, again.world]


def test_a_world_needs_an_address_others_reach(tmp_path: Path) -> None:
    config = msgspec.structs.replace(ASYNC, run_dir=str(tmp_path))
    with pytest.raises(InvalidConfigError, match="advertise-host"):
        _plan(InMemoryEventLog(), config, "0", host="0.0.0.0")
    with pytest.raises(InvalidConfigError, match="no network interface"):
        _plan(InMemoryEventLog(), config, "0", host="0.0.0.0", advertise_host="192.0.2.1")  # TEST-NET-1


def test_cells_that_move_between_roles_stay_on_one_machine(tmp_path: Path) -> None:
    config = msgspec.structs.replace(ASYNC, policy="elastic", run_dir=str(tmp_path))
    assert config.cells_move
    with pytest.raises(InvalidConfigError, match="--trainers all"):
        _plan(InMemoryEventLog(), config, "0")


def test_the_interface_holding_an_address() -> None:
    assert interface_of("127.0.0.1") == "lo"
    with pytest.raises(InvalidConfigError, match="no network interface"):
        interface_of("192.0.2.1")


def test_a_satellite_node_starts_its_cells_in_each_newer_world() -> None:
    newest: list[str | None] = [None]
    made: list[str] = []

    def make() -> NodeAgent:
        world = newest[0]
        made.append(world or "-")
        training = LiveTraining(steps=1, mu=1, packing=PackingConfig(8, 1, 1))
        trainers = TrainerPlan((), training, Path(), 0, 0, world=world) if world else None
        return NodeAgent(NodePlan(trainers=trainers))

    trainers = Trainers(make, follow=lambda: newest[0])
    try:
        assert trainers.step() == "" and made == ["-"]
        trainers.followed_at = 0.0
        assert trainers.step() == "" and made == ["-"]  # still no world: nothing started again
        newest[0] = "w1"
        trainers.followed_at = 0.0
        assert "w1" in trainers.step() and made == ["-", "w1"]
        trainers.followed_at = 0.0
        assert trainers.step() == "" and made == ["-", "w1"]  # the same world: left running
        newest[0] = "w2"
        trainers.followed_at = 0.0
        assert "w2" in trainers.step() and made == ["-", "w1", "w2"]
        assert trainers.agent is not None and trainers.agent.plan.trainers is not None
        assert trainers.agent.plan.trainers.world == "w2"
    finally:
        trainers.close()


def test_a_world_records_what_satellites_elsewhere_need() -> None:
    fields = {f for f in TrainerWorldStarted.__struct_fields__}
    assert {"dist_init", "queue_prefix", "cells", "first_step", "version", "model_dir"} <= fields


def test_a_runs_incarnation_is_the_same_in_every_life_and_differs_across_databases() -> None:
    from gyre_store import NewEvent, RunConfigured
    from gyre_tools.serve import run_incarnation

    logs = [InMemoryEventLog(), InMemoryEventLog()]
    for log in logs:  # the same run id, configured in two databases
        log.append([NewEvent(RunConfigured(run_id="r", config_toml=""), "configured:r")])
        log.append(
            [NewEvent(RunConfigured(run_id="r", config_toml=""), "configured:r")]
        )  # a later life: no new event
    first, second = (run_incarnation(log, "r") for log in logs)
    assert first == run_incarnation(logs[0], "r") and first != second
    with pytest.raises(SystemExit, match="not configured"):
        run_incarnation(InMemoryEventLog(), "other")


def test_the_world_is_recorded_at_the_advertised_address_not_the_listening_one(tmp_path: Path) -> None:
    config = msgspec.structs.replace(ASYNC, run_dir=str(tmp_path))
    log = InMemoryEventLog()
    core = _plan(log, config, "0", host="0.0.0.0", advertise_host="localhost").trainers
    assert core is not None and core.cells[0].dist_init == "tcp://localhost:29555"
    world = newest_world(log, "r")
    assert world is not None and world.dist_init == "tcp://localhost:29555"


def test_the_worlds_weight_transport_and_each_cells_addresses_reach_every_cell(tmp_path: Path) -> None:
    config = msgspec.structs.replace(
        ASYNC, run_dir=str(tmp_path), train=msgspec.structs.replace(ASYNC.train, weight_transport="mooncake")
    )
    log = InMemoryEventLog()
    core = _plan(
        log, config, "0", host="0.0.0.0", advertise_host="localhost", cell_metrics_port=9400
    ).trainers  # type: ignore[arg-type]
    world = newest_world(log, "r")
    assert world is not None and world.transport == "mooncake"
    # A satellite node with a config that says otherwise still uses the world's transport.
    torch_config = msgspec.structs.replace(config, train=ASYNC.train)
    satellites = _plan(log, torch_config, "1-2", advertise_host="127.0.0.2", cell_metrics_port=0).trainers  # type: ignore[arg-type]
    assert core is not None and satellites is not None
    assert [(c.transport, c.transport_host, c.metrics_port, c.metrics_host) for c in core.cells] == [
        ("mooncake", "localhost", 9400, "0.0.0.0")
    ]
    assert [(c.transport, c.transport_host, c.metrics_port) for c in satellites.cells] == [
        ("mooncake", "127.0.0.2", 0),
        ("mooncake", "127.0.0.2", 0),
    ]
    unserved = _plan(log, config, "1,2").trainers
    assert unserved is not None and {c.metrics_port for c in unserved.cells} == {None}
    numbered = _plan(log, config, "1,2", cell_metrics_port=9400).trainers  # type: ignore[arg-type]
    assert numbered is not None and [c.metrics_port for c in numbered.cells] == [9401, 9402]
