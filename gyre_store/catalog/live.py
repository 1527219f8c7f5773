"""The event types that connect a live run's processes: tasks, engines and launch requests.

Processes of a live run find each other through the log: a run's tasks are defined in it
(the launcher builds workspaces from them, evaluator workers run their tests), rollout
engines announce where they serve (the proxy routes to them, the publisher sends them
weights), and the controller's start decisions become launch requests the launcher carries
out. Each fact is appended by the component that knows it. The proxy's note of a record the
store refused for good is here too: it is about the run's plumbing, not its content.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative
from gyre_store.log.events import Event

_PathName = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-/]+$")]


class TaskSplit(enum.StrEnum):
    """Which instances training samples from, and which are kept for evaluation only."""

    TRAIN = "train"
    HELDOUT = "heldout"


@REGISTRY.register("task.defined", stream="task", key=("run_id", "task_id"))
class TaskDefined(Event, frozen=True, kw_only=True):
    """One task instance of a run: the prompt, the starting workspace and the hidden tests.

    A built-in family's task carries its files: ``files`` become the agent's workspace;
    ``tests`` are written beside it, never inside, and ``test_command`` runs with the
    preserved workspace as its working directory (``{tests}`` is the tests folder,
    ``{report}`` the JUnit XML report it must write). A task read from a source (a Harbor
    folder, a JSONL file) carries none: ``source`` says where its files are (binary files and
    git repositories included), ``content_hash`` what its starting workspace holds (a workspace
    written from files that no longer match is refused), and ``workdir`` where a sandbox shows
    the workspace.
    """

    run_id: Ident
    task_id: Ident
    split: TaskSplit
    prompt: str
    files: dict[_PathName, str] = msgspec.field(default_factory=dict)
    tests: dict[_PathName, str] = msgspec.field(default_factory=dict)
    test_command: tuple[str, ...] = ()
    budget_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    family: str = ""
    source: str = ""  # the task source (a folder, a .jsonl file); empty: the files are above
    content_hash: str = ""  # the starting workspace's hash (gyre_train.tasks.tree_hash)
    workdir: str = ""  # the workspace's path inside a sandbox ("": the task's default)


@REGISTRY.register("engine.registered", stream="engine", key="engine")
class EngineRegistered(Event, frozen=True, kw_only=True):
    """A rollout engine serves SGLang's HTTP API at ``url`` (``pool`` or ``cell-<index>``)."""

    engine: Ident
    run_id: Ident
    url: str
    cell_index: int = -1  # -1 for an engine of the separate rollout pool
    capacity: NonNegative = 0  # concurrent executions it was sized for (C_e or its pool share)
    # Where its Mooncake Transfer Engine (KV-cache migration) is reached: the host other
    # machines read its exposed caches at; "" when it runs none of gyre's (an SGLang server).
    kv_transfer_host: str = ""


@REGISTRY.register("proxy.registered", stream="proxy", key="run_id")
class ProxyRegistered(Event, frozen=True, kw_only=True):
    """The run's proxy serves the harnesses' model APIs at ``url``, the address it advertises
    to other machines; launchers that are not told the proxy's URL take the newest."""

    run_id: Ident
    url: str


@REGISTRY.register("trainer.world_started", stream="trainer", key="run_id")
class TrainerWorldStarted(Event, frozen=True, kw_only=True):
    """The node running the core started a world of the run's ``cells`` trainer cells (each
    start anew, after a core's death too). Satellites on other machines join the newest:
    torch.distributed's rendezvous at ``dist_init`` (the address the core's node advertises),
    their claims under ``queue_prefix``, from policy ``version`` at step ``first_step``, built
    from the weights in ``model_dir`` (the run's initial checkpoint or a published policy)."""

    run_id: Ident
    world: Ident  # this world among the run's: part of its queue keys
    dist_init: str
    queue_prefix: str
    cells: Annotated[int, msgspec.Meta(ge=1)]
    first_step: NonNegative
    version: NonNegative
    model_dir: str
    node: str = ""  # the host name of the core's node
    transport: str = "torch"  # how joining satellites pull the core's weights: torch or mooncake


@REGISTRY.register("trainer.transport_started", stream="trainer", key="run_id")
class TrainerTransportStarted(Event, frozen=True, kw_only=True):
    """Trainer cell ``cell`` of the world whose claims are under ``queue_prefix`` started its
    weight transport: Mooncake's Transfer Engine at ``segment`` (``host:port``, the address
    other machines read its exposed memory at). Each snapshot the core exposes names the same
    segment on the world's board, which is where a joining satellite takes it from."""

    run_id: Ident
    queue_prefix: str
    cell: NonNegative
    transport: str
    segment: str
    node: str = ""  # the host name of the cell's machine


@REGISTRY.register("execution.start_requested", stream="execution", key="execution_id")
class ExecutionStartRequested(Event, frozen=True, kw_only=True):
    """The scheduler decided to start this execution of task ``task_id`` on ``engine``."""

    execution_id: Ident
    run_id: Ident
    task_id: Ident
    engine: Ident
    harness: str = ""


@REGISTRY.register("run.configured", stream="run", key="run_id")
class RunConfigured(Event, frozen=True, kw_only=True):
    """The configuration a live run runs with, as the TOML text every process reads.

    Paths in it are resolved (the starting policy, the run's folder), so node agents on other
    machines and a restarted ``gyre run`` read the same settings from the log."""

    run_id: Ident
    config_toml: str


@REGISTRY.register("record.quarantined", stream="quarantine", key="record_stream")
class RecordQuarantined(Event, frozen=True, kw_only=True):
    """The proxy's record spool set aside an event the store refused for good (``error``): event
    ``record_id`` of type ``record_type`` on stream ``record_stream``, with idempotency key
    ``record_key``. The event itself is one JSON line of the file ``dead_letter`` on ``host``
    (empty: it could not be kept), to be read, fixed and appended again; the spool went on
    writing the events behind it."""

    record_stream: str
    record_type: str
    record_id: str
    record_key: str = ""
    run_id: str | None = None
    error: str
    dead_letter: str
    host: str = ""
