"""A rollout engine of a live run: the reference engine serving the run's newest policy.

On start it loads the newest policy the run has published (or the run's starting policy),
serves SGLang's HTTP API, and records ``engine.registered`` with its URL, so the proxy routes
to it and the core publishes to it. A publication that lands between loading and registering
would miss it, so after registering it looks again and loads anything newer itself. It is
an engine of the separate rollout pool (``cell_index`` -1, a process of its own:
``rollout_process``) or the rollout role of an elastic cell (``cell_index`` >= 0), which
starts and stops its ``RolloutEngine`` as its role changes (elastic.py).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.engines.weights import EngineWeightSink
from gyre_store import (
    EngineRegistered,
    EventLog,
    EventMetadata,
    NewEvent,
    PostgresEventLog,
    StoreConfig,
    StreamId,
    WeightsPublished,
)
from gyre_train.cells.live import policy_dir


@dataclass(frozen=True, slots=True)
class RolloutEngineConfig:
    """One rollout engine of a run, and where its policies come from (picklable)."""

    run_id: str
    engine: str  # unique in the log, e.g. "<run>:pool-0"
    cell_index: int  # -1: the separate rollout pool
    capacity: int
    database_url: str
    initial_model: Path  # the run's starting policy (save_pretrained folder)
    publish_dir: Path  # where the core publishes policy-v<N> folders
    max_context: int = 8192
    seed: int = 0
    torch_threads: int = 1
    host: str = "127.0.0.1"
    port: int | None = None


def newest_policy(log: EventLog, run_id: str, publish_dir: Path) -> tuple[int, Path | None]:
    """The newest published version of the run whose folder exists, and that folder."""
    versions = sorted(
        (
            r.event.policy_version
            for r in log.read_stream(StreamId("policy", run_id))
            if isinstance(r.event, WeightsPublished)
        ),
        reverse=True,
    )
    for version in versions:
        folder = policy_dir(publish_dir, version)
        if (folder / "config.json").is_file():
            return version, folder
    return 0, None


class RolloutEngine:
    """One rollout engine of a run, started and stopped at will: a pool engine's whole life,
    or each rollout role of an elastic cell. ``start`` serves the newest published policy and
    registers the engine; ``stop`` ends the server and drops the model (its weights, KV caches
    and buffers)."""

    def __init__(self, config: RolloutEngineConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.server: ReferenceEngineServer | None = None

    def start(self) -> None:
        config = self.config
        version, folder = newest_policy(self.log, config.run_id, config.publish_dir)
        source = ModelSource(model_dir=folder or config.initial_model, tokenizer="qwen")
        engine_config = ReferenceEngineConfig(
            source=source,
            max_context=config.max_context,
            seed=config.seed,
            weight_version=str(version),
            torch_threads=config.torch_threads,
            tokenizer_vocab_only=True,
        )
        server = ReferenceEngineServer(engine_config, host=config.host, port=config.port).__enter__()
        self.server = server
        registered = EngineRegistered(
            engine=config.engine,
            run_id=config.run_id,
            url=server.base_url,
            cell_index=config.cell_index,
            capacity=config.capacity,
        )
        # One registration per start (a retried append finds its own): a cell's engine that
        # starts again must be routed to again, even at an address it had before.
        key = f"engine:{config.engine}:{server.base_url}:{uuid.uuid4().hex[:12]}"
        self.log.append([NewEvent(registered, key, metadata=EventMetadata(run_id=config.run_id))])
        newer, newer_folder = newest_policy(self.log, config.run_id, config.publish_dir)
        if newer > version and newer_folder is not None:
            asyncio.run(EngineWeightSink(server.base_url).load_from_disk(newer_folder, newer))

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.__exit__(None, None, None)

    def stop_accepting(self) -> None:
        """New generates are refused (the proxy then routes them elsewhere); in-flight ones go on."""
        if self.server is not None:
            self.server.engine.accepting = False

    def in_flight(self) -> int:
        return 0 if self.server is None else self.server.engine.loop.in_flight

    def abort_all(self) -> None:
        if self.server is not None:
            self.server.engine.abort(None)


def serve_rollout(config: RolloutEngineConfig, stop: threading.Event) -> None:
    """Serve until ``stop`` is set (a process's main loop; see ``rollout_process``)."""
    with PostgresEventLog(StoreConfig(config.database_url)) as log:
        engine = RolloutEngine(config, log)
        engine.start()
        try:
            stop.wait()
        finally:
            engine.stop()


def rollout_process(config: RolloutEngineConfig) -> None:
    """Entry point of an engine process: serve until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve_rollout(config, stop)
