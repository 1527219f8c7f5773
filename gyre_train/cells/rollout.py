"""A rollout engine of a live run: the reference engine or a real SGLang server, serving the
run's newest policy.

On start it loads the newest policy the run has published (or the run's starting policy),
serves SGLang's HTTP API (the reference engine in this process; SGLang as a child process in
its own process group, started by ``sglang_command``, ``gyre_proxy.engines.sglang_server``),
and records ``engine.registered`` with its URL, so the proxy routes to it and the core
publishes to it. A publication that lands between loading and registering
would miss it, so after registering it looks again and loads anything newer itself. It is
an engine of the separate rollout pool (``cell_index`` -1, a process of its own:
``rollout_process``) or the rollout role of an elastic cell (``cell_index`` >= 0), which
starts and stops its ``RolloutEngine`` as its role changes (elastic.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from gyre_proxy.engines import (
    SGLangServer,
    SGLangServerConfig,
    advertised_url,
    needs_advertise_host,
    reachable_host,
)
from gyre_proxy.engines.refengine import (
    ModelSource,
    MooncakeConfig,
    ReferenceEngineConfig,
    ReferenceEngineServer,
)
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
    until_signal,
)
from gyre_train.cells.live import policy_dir
from gyre_train.exceptions import EngineServerDied, InvalidConfigError

ENGINE_KINDS = ("reference", "sglang")


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
    host: str = "127.0.0.1"  # where it listens
    port: int | None = None
    # The host other machines reach it at, in the URL it registers (the proxy and the publisher
    # call that URL); None: ``host`` itself, which must then not be a wildcard.
    advertise_host: str | None = None
    kind: str = "reference"  # or "sglang" (ENGINE_KINDS)
    # kind "sglang": what starts a server as `[*sglang_command, model_dir, port, *options]`
    # (tools/sglang_setup.sh serve), and where its output goes.
    sglang_command: tuple[str, ...] = ()
    log_dir: Path | None = None
    start_timeout_s: float = 600.0
    # kind "reference": where its weights and KV cache live ("cpu", "cuda", "cuda:N").
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise InvalidConfigError(f"engine kind must be one of {list(ENGINE_KINDS)}, got {self.kind!r}")
        if self.kind == "sglang" and not self.sglang_command:
            raise InvalidConfigError(f"{self.engine}: an SGLang engine needs the command that starts it")
        if needs_advertise_host(self.host, self.advertise_host):
            raise InvalidConfigError(
                f"{self.engine}: an engine listening on every address ({self.host!r}) needs an "
                "advertise host, the address the proxy and the publisher reach it at"
            )

    @property
    def reachable_host(self) -> str:
        """The address other machines reach this engine's machine at."""
        return reachable_host(self.host, self.advertise_host)

    def advertised(self, base_url: str) -> str:
        """The URL others call for a server listening at ``base_url``."""
        return advertised_url(base_url, self.advertise_host)


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


def _tokenizer_of(initial_model: Path) -> str:
    """The reference engine's tokenizer: the starting checkpoint's own (published folders are
    its weights only), or the bundled Qwen3.6 vocabulary of the demo's policy."""
    tokenizer = initial_model / "tokenizer.json"
    return f"file:{tokenizer}" if tokenizer.is_file() else "qwen"


def reference_engine_config(config: RolloutEngineConfig, folder: Path, version: int) -> ReferenceEngineConfig:
    """The reference engine a rollout engine serves: the policy in ``folder`` at ``version``,
    its Mooncake Transfer Engine (KV migration) at the address other machines reach it at."""
    return ReferenceEngineConfig(
        source=ModelSource(
            model_dir=folder, tokenizer=_tokenizer_of(config.initial_model), device=config.device
        ),
        max_context=config.max_context,
        seed=config.seed,
        weight_version=str(version),
        torch_threads=config.torch_threads,
        tokenizer_vocab_only=True,
        mooncake=MooncakeConfig(host=config.reachable_host),
    )


class _ReferenceServing:
    """The reference engine, in this process."""

    def __init__(self, config: RolloutEngineConfig, folder: Path, version: int) -> None:
        engine_config = reference_engine_config(config, folder, version)
        self.server = ReferenceEngineServer(engine_config, host=config.host, port=config.port).__enter__()
        self.base_url = self.server.base_url

    def stop_accepting(self) -> None:
        self.server.engine.accepting = False

    def in_flight(self) -> int:
        return self.server.engine.loop.in_flight

    def abort_all(self) -> None:
        self.server.engine.abort(None)

    def alive(self) -> bool:
        return True  # it lives and dies with this process

    @property
    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.server.__exit__(None, None, None)


class _SGLangServing:
    """A real SGLang server, a child process group of this process."""

    def __init__(self, config: RolloutEngineConfig, folder: Path, version: int) -> None:
        name = config.engine.rsplit(":", 1)[-1]
        server_config = SGLangServerConfig(
            command=config.sglang_command,
            model_dir=folder,
            weight_version=str(version),
            host=config.host,
            port=config.port,
            context_length=config.max_context,
            start_timeout_s=config.start_timeout_s,
            log_path=config.log_dir / f"sglang-{name}.log" if config.log_dir is not None else None,
        )
        self.server = SGLangServer(server_config).__enter__()
        self.base_url = self.server.base_url

    def stop_accepting(self) -> None:
        """Nothing to do at the engine: SGLang has no admission switch, and the proxy stops
        routing new requests to an engine once its drain is recorded (engine.routing_changed)."""

    def in_flight(self) -> int:
        return self.server.in_flight()

    def abort_all(self) -> None:
        self.server.abort_all()

    def alive(self) -> bool:
        return self.server.alive()

    @property
    def pid(self) -> int | None:
        """The server's process, which leads its process group."""
        return None if self.server.process is None else self.server.process.pid

    def close(self) -> None:
        self.server.stop()


class RolloutEngine:
    """One rollout engine of a run, started and stopped at will: a pool engine's whole life,
    or each rollout role of an elastic cell. ``start`` serves the newest published policy and
    registers the engine; ``stop`` ends the server and drops the model (its weights, KV caches
    and buffers; an SGLang engine's whole process group, so a cell that moves to training
    frees its memory by ending the server, and a new one starts on its return)."""

    def __init__(self, config: RolloutEngineConfig, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.serving: _ReferenceServing | _SGLangServing | None = None

    def start(self) -> None:
        config = self.config
        version, folder = newest_policy(self.log, config.run_id, config.publish_dir)
        kind = _SGLangServing if config.kind == "sglang" else _ReferenceServing
        serving = kind(config, folder or config.initial_model, version)
        self.serving = serving
        url = config.advertised(serving.base_url)
        registered = EngineRegistered(
            engine=config.engine,
            run_id=config.run_id,
            url=url,
            cell_index=config.cell_index,
            capacity=config.capacity,
            kv_transfer_host=config.reachable_host if config.kind == "reference" else "",
        )
        # One registration per start (a retried append finds its own): a cell's engine that
        # starts again must be routed to again, even at an address it had before.
        key = f"engine:{config.engine}:{url}:{uuid.uuid4().hex[:12]}"
        self.log.append([NewEvent(registered, key, metadata=EventMetadata(run_id=config.run_id))])
        newer, newer_folder = newest_policy(self.log, config.run_id, config.publish_dir)
        if newer > version and newer_folder is not None:
            timeout_s = max(60.0, config.start_timeout_s)
            asyncio.run(EngineWeightSink(serving.base_url, timeout_s).load_from_disk(newer_folder, newer))

    def stop(self) -> None:
        serving, self.serving = self.serving, None
        if serving is not None:
            serving.close()

    @property
    def server_pid(self) -> int | None:
        """The serving process (an SGLang server's leads its process group); None when stopped."""
        return None if self.serving is None else self.serving.pid

    @property
    def base_url(self) -> str | None:
        """Where this process reaches the server (on its own host)."""
        return None if self.serving is None else self.serving.base_url

    @property
    def url(self) -> str | None:
        """The URL it registered, which other hosts call."""
        return None if self.serving is None else self.config.advertised(self.serving.base_url)

    def stop_accepting(self) -> None:
        """New generates are refused (the proxy then routes them elsewhere); in-flight ones go on."""
        if self.serving is not None:
            self.serving.stop_accepting()

    def in_flight(self) -> int:
        return 0 if self.serving is None else self.serving.in_flight()

    def abort_all(self) -> None:
        if self.serving is not None:
            self.serving.abort_all()

    def alive(self) -> bool:
        """Whether the server started last still serves (False once stopped or dead)."""
        return self.serving is not None and self.serving.alive()


def serve_rollout(config: RolloutEngineConfig, stop: threading.Event) -> None:
    """Serve until ``stop`` is set (a process's main loop; see ``rollout_process``)."""
    with PostgresEventLog(StoreConfig(config.database_url)) as log:
        engine = RolloutEngine(config, log)
        engine.start()
        try:
            # An SGLang server that dies ends this process, so the node agent starts it again
            # (a new server, registered anew, loading the newest policy).
            while not stop.wait(1.0):
                if not engine.alive():
                    raise EngineServerDied(f"{config.engine} (see its log)")
        finally:
            engine.stop()


def rollout_process(config: RolloutEngineConfig) -> None:
    """Entry point of an engine process: serve until SIGTERM or SIGINT."""
    serve_rollout(config, until_signal())
