"""``ReferenceEngine``: the model, its decode loop and the state behind the HTTP API.

It validates requests the way SGLang does (same limits, same messages), hands them to the
``DecodeLoop``, and owns what SGLang keeps in its tokenizer manager: the weight version, the
open weight-update session, the broadcast group, memory occupation, and gyre's own admission
switch (``accepting``), which the scheduler flips during role transitions, and the KV caches
kept for migration (pinned on a source, imported on a destination), with the Mooncake Transfer
Engine that lets a destination read a pinned payload straight from the source. HTTP lives in
``server.py``; this module can be driven in-process, as the benchmark does.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import torch

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.refengine.decode_loop import DecodeLoop, EventSink, StepEvent
from gyre_proxy.engines.refengine.kvcache import CacheLayout, KvEntry
from gyre_proxy.engines.refengine.kvmooncake import KvTransfer, MooncakeConfig, MooncakeKvTransfer
from gyre_proxy.engines.refengine.kvpayload import check_descriptor, pack, unpack
from gyre_proxy.engines.refengine.kvstore import (
    ExposedPayloads,
    Exposure,
    KvLimits,
    PinnedCaches,
    PrefixCache,
)
from gyre_proxy.engines.refengine.model import (
    LoadedModel,
    ModelSource,
    load_model,
    load_weights,
    read_weights,
)
from gyre_proxy.engines.refengine.scripted import ScriptedPolicy
from gyre_proxy.engines.types import SamplingConfig
from gyre_proxy.engines.weights import (
    GYRE_SAFETENSORS_FORMAT,
    WeightUpdateGroup,
    deserialize_safetensors,
    dtype_from_name,
)
from gyre_proxy.exceptions import (
    CacheNotMigratable,
    ModelLoadError,
    PayloadIncompatible,
    PinNotFound,
    RequestRejected,
    TransferUnavailable,
)

PAUSE_MODES = ("abort", "in_place", "retract")  # SGLang's; the reference engine takes the first two


class PausableDecodeLoop(DecodeLoop):
    """The decode loop with SGLang's in-place pause: while paused no request advances (each
    keeps its KV cache, between two passes) and an exclusive job, a weight update, runs at
    once instead of waiting for the requests in flight to finish; ``resume`` lets them go on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused = False

    def pause(self) -> None:
        with self._cond:
            self.paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self.paused = False
            self._cond.notify_all()

    def _pass(self, runnable: list[Any]) -> None:
        if not self.paused:
            super()._pass(runnable)
            return
        # Paused with requests in flight: wait for a job, an abort, a pin or the resume (the
        # loop applies aborts and pins itself); a job runs now, on this thread, as always.
        with self._cond:
            while self.paused and not (self._jobs or self._aborts or self._pins or self._stopping):
                self._cond.wait()
            job = self._jobs[0] if self.paused and self._jobs and not self._stopping else None
        if job is not None:
            if job.abort_all:
                with self._cond:
                    self._abort_everything("Abort for weight update")
            self._run_job(job)


@dataclass(frozen=True)
class ReferenceEngineConfig:
    """Everything the reference engine is built from."""

    source: ModelSource = field(default_factory=ModelSource)
    max_context: int = 2048
    seed: int = 0
    weight_version: str = "default"
    script: Path | None = None
    return_original_logprob: bool = False
    incremental_streaming_output: bool = False
    torch_threads: int = 1
    tokenizer_vocab_only: bool = False  # never sample a padding id past the tokenizer's
    kv_pins: KvLimits = field(default_factory=KvLimits)  # caches pinned for export (source)
    kv_imports: KvLimits = field(default_factory=KvLimits)  # imported prefix caches (destination)
    # Pinned payloads read engine to engine over Mooncake where it is installed (else HTTP only).
    mooncake: MooncakeConfig = field(default_factory=MooncakeConfig)


class ReferenceEngine:
    """A served causal LM; a context manager that starts and stops its decode thread."""

    def __init__(self, config: ReferenceEngineConfig, *, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(config.source)
        self.context_length = min(config.max_context, self.loaded.max_positions)
        self.policy = (
            ScriptedPolicy.from_file(config.script, self.loaded.tokenizer) if config.script else None
        )
        if self.policy is not None:
            self.policy.check_vocab(self.loaded.vocab_size)
        self.loop = PausableDecodeLoop(
            self.loaded,
            context_length=self.context_length,
            weight_version=config.weight_version,
            return_original_logprob=config.return_original_logprob,
            torch_threads=config.torch_threads,
            tokenizer_vocab_only=config.tokenizer_vocab_only,
            pinned=PinnedCaches(config.kv_pins),
            prefixes=PrefixCache(config.kv_imports),
        )
        self.accepting = True
        self.memory_released = False
        self._seeds = random.Random(config.seed)
        self._rids: set[str] = set()
        self._lock = threading.Lock()
        self._session_open = False
        self._groups: dict[str, WeightUpdateGroup] = {}
        self.kv_transfer: KvTransfer = MooncakeKvTransfer(config.mooncake)
        self.exposed = ExposedPayloads()

    def __enter__(self) -> Self:
        self.loop.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.loop.stop()
        for group in self._groups.values():
            group.close()
        self.exposed.pop_all()
        self.kv_transfer.close()

    @property
    def weight_version(self) -> str:
        return self.loop.weight_version

    # -- generation ----------------------------------------------------------------------------

    def validate(self, request: engine_api.GenerateRequest) -> SamplingConfig:
        """The request's sampling config; raises ``RequestRejected`` with SGLang's messages."""
        if not self.accepting:
            raise RequestRejected(engine_api.NOT_ACCEPTING_MESSAGE, 503)
        if self.memory_released:
            raise RequestRejected("engine memory is released; call /resume_memory_occupation", 503)
        ids = request.input_ids
        if not ids:
            raise RequestRejected("input_ids is empty")
        if any(not 0 <= token < self.loaded.vocab_size for token in ids):
            raise RequestRejected(f"input_ids has ids outside the vocabulary of {self.loaded.vocab_size}")
        if len(ids) >= self.context_length:
            raise RequestRejected(
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        sampling = SamplingConfig.from_wire(request.sampling_params)
        if sampling.max_new_tokens < 0 or sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
            raise RequestRejected(f"invalid sampling_params: {request.sampling_params}")
        total = len(ids) + sampling.max_new_tokens
        if total >= self.context_length:
            raise RequestRejected(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {total} tokens: {len(ids)} "
                f"tokens from the input messages and {sampling.max_new_tokens} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        return sampling

    def submit(self, request: engine_api.GenerateRequest, rid: str, sink: EventSink) -> None:
        """Validate and queue ``request``; ``sink`` receives its events on the decode thread."""
        sampling = self.validate(request)
        with self._lock:
            if rid in self._rids:
                raise RequestRejected(f"Duplicate request ID {rid!r}")
            self._rids.add(rid)
        forced = None
        if self.policy is not None:
            prompt = self.loaded.tokenizer.decode(request.input_ids, skip_special_tokens=False)
            script = self.policy.next_output(prompt)
            forced = script[: sampling.max_new_tokens] if script is not None else None
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)

        def sink_and_release(event: StepEvent) -> None:
            if event.finish is not None:
                with self._lock:
                    self._rids.discard(rid)
            sink(event)

        self.loop.submit(rid, list(request.input_ids), sampling, sink_and_release, forced=forced, seed=seed)

    def abort(self, rid: str | None) -> None:
        self.loop.abort(rid)

    # -- pausing generation (SGLang's /pause_generation and /continue_generation) -------------

    @property
    def paused(self) -> bool:
        return self.loop.paused

    async def pause_generation(self, mode: str) -> None:
        """Pause as SGLang does in ``mode``: ``in_place`` stops decoding between two passes
        (requests keep their KV cache); ``abort`` aborts every request in flight and returns
        once none is left. Either way new requests wait (``wait_while_paused``) and a weight
        update runs at once. ``retract`` (free the KV, compute it again on resume) is refused
        with ``RequestRejected``: the reference engine keeps each request's own cache."""
        if mode not in PAUSE_MODES:
            raise RequestRejected(f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        if mode == "retract":
            raise RequestRejected("the reference engine pauses in_place or abort, not retract")
        self.loop.pause()
        if mode == "abort":
            while self.loop.in_flight:
                self.loop.abort(None, "Abort for pause_generation")
                await asyncio.sleep(0.01)

    def continue_generation(self) -> None:
        self.loop.resume()

    async def wait_while_paused(self, poll_s: float = 0.01) -> None:
        """Return once generation is not paused (new requests wait here, as in SGLang)."""
        while self.loop.paused:
            await asyncio.sleep(poll_s)

    # -- KV migration --------------------------------------------------------------------------

    async def pin_abort(self, rid: str) -> KvEntry:
        """Abort the decoding request ``rid`` keeping its KV pinned; see ``DecodeLoop.pin_abort``."""
        return await asyncio.wrap_future(self.loop.pin_abort(rid))

    async def export_kv(self, rid: str) -> bytes:
        """The payload of ``rid``'s pinned cache (it stays pinned); raises ``PinNotFound``."""
        entry = self.loop.pinned.get(rid)
        exposure = self.exposed.get(rid)
        if exposure is not None and exposure.entry is entry:  # packed already for Mooncake
            return exposure.data
        layout = self._layout()
        return await asyncio.to_thread(pack, entry, layout)

    async def expose_kv(self, rid: str) -> Exposure:
        """Register the payload of ``rid``'s pinned cache with the Transfer Engine for a
        destination to read, until ``release_kv``; exposing it again returns the same one.

        Raises ``TransferUnavailable`` without Mooncake (first, whatever else holds: the caller
        moves it over HTTP), ``PinNotFound``, or ``TransferFailed`` when it cannot register.
        """
        usable, why = self.kv_transfer.status()
        if not usable:
            raise TransferUnavailable(why)
        entry = self.loop.pinned.get(rid)
        found = self.exposed.get(rid)
        if found is not None and found.entry is entry:
            return found
        data = await asyncio.to_thread(pack, entry, self._layout())
        segment, address = await asyncio.to_thread(self.kv_transfer.expose, data)
        exposure = Exposure(entry, data, segment, address)
        replaced = self.exposed.put(rid, exposure)
        if replaced is not None:  # the payload of an older pin of this rid
            self.kv_transfer.withdraw(replaced.address)
        try:
            still = self.loop.pinned.get(rid) is entry
        except PinNotFound:
            still = False
        if not still:  # released (or pinned anew) while it was packed: nothing may stay registered
            self._withdraw(rid)
            raise PinNotFound(f"the pinned KV cache of {rid!r} was released while it was exposed")
        return exposure

    def _withdraw(self, rid: str) -> None:
        exposure = self.exposed.pop(rid)
        if exposure is not None:
            self.kv_transfer.withdraw(exposure.address)

    def release_kv(self, rid: str) -> None:
        """Unpin ``rid``'s cache (the destination took over) and stop exposing its payload;
        raises ``PinNotFound``."""
        try:
            self.loop.pinned.release(rid)
        finally:
            self._withdraw(rid)

    async def import_kv(self, data: bytes) -> tuple[str, KvEntry]:
        """Keep payload ``data`` as a prefix-cache entry, under the source's rid; raises
        ``PayloadIncompatible`` for a payload of another model or weight version, ``KvStoreFull``
        when it alone exceeds the import bound."""
        return await self._keep(data, self._layout())

    async def pull_kv(self, descriptor: engine_api.KvTransferDescriptor) -> tuple[str, KvEntry]:
        """Read the payload ``descriptor`` points at from the source's Transfer Engine and keep
        it as ``import_kv`` keeps an HTTP payload (the same checks, the same entry).

        Raises ``TransferUnavailable`` (no Mooncake here, or another protocol than the
        source's), ``PayloadIncompatible`` or ``KvStoreFull`` (before reading when the
        descriptor already says so), ``TransferFailed`` (the read failed: the source still
        holds its pin, so the caller can move it over HTTP).
        """
        usable, why = self.kv_transfer.status()
        if not usable:
            raise TransferUnavailable(why)
        if descriptor.protocol != self.kv_transfer.protocol:
            raise TransferUnavailable(
                f"the source exposes its payload over {descriptor.protocol!r}, this engine reads "
                f"over {self.kv_transfer.protocol!r}"
            )
        layout = self._layout()
        check_descriptor(
            descriptor,
            layout,
            weight_version=self.weight_version,
            context_length=self.context_length,
            max_bytes=self.loop.prefixes.limits.max_bytes,
        )
        data = await asyncio.to_thread(
            self.kv_transfer.read, descriptor.segment, descriptor.address, descriptor.nbytes
        )
        return await self._keep(data, layout, expected=descriptor)

    async def _keep(
        self,
        data: bytes,
        layout: CacheLayout,
        *,
        expected: engine_api.KvTransferDescriptor | None = None,
    ) -> tuple[str, KvEntry]:
        entry = await asyncio.to_thread(
            unpack,
            data,
            layout,
            weight_version=self.weight_version,
            vocab_size=self.loaded.vocab_size,
            context_length=self.context_length,
        )
        if expected is not None and (entry.rid, entry.num_tokens) != (expected.rid, expected.num_tokens):
            # The address held another payload than the descriptor names: keep nothing.
            raise PayloadIncompatible(
                f"the bytes read are the payload of {entry.rid!r} ({entry.num_tokens} tokens), "
                f"not of {expected.rid!r} ({expected.num_tokens} tokens)"
            )
        self.loop.prefixes.put(entry.rid, entry)
        return entry.rid, entry

    def flush_prefix_cache(self) -> int:
        """Drop every imported cache; returns how many there were."""
        return self.loop.prefixes.clear()

    def _layout(self) -> CacheLayout:
        if self.loop.layout is None:
            raise CacheNotMigratable(
                f"{self.loaded.model_path}: the KV cache of this model is not plain per-layer keys "
                "and values (sliding-window or recurrent layers), so it cannot be migrated"
            )
        return self.loop.layout

    # -- weights -------------------------------------------------------------------------------

    async def _exclusive(self, job: Callable[[], int], *, abort_all: bool) -> int:
        return await asyncio.wrap_future(self.loop.run_exclusive(job, abort_all=abort_all))

    def _install(self, tensors: dict[str, torch.Tensor], weight_version: str | None) -> int:
        count = load_weights(self.loaded.model, tensors)
        # Imported KV was computed under the old weights. Pinned caches stay: they are exported
        # with the version they were computed under, and a destination checks it.
        self.loop.prefixes.clear()
        if weight_version is not None:
            self.loop.weight_version = weight_version
        return count

    async def update_weights_from_disk(self, request: engine_api.UpdateWeightsFromDiskRequest) -> int:
        """Load ``model_path`` once in-flight requests are done; raises ``ModelLoadError``."""
        path = Path(request.model_path)

        def job() -> int:
            return self._install(read_weights(path), request.weight_version)

        return await self._exclusive(job, abort_all=request.abort_all_requests)

    def begin_weight_update(self) -> None:
        """Open the weight-update session; raises ``ModelLoadError`` if one is open (as SGLang)."""
        if self._session_open:
            raise ModelLoadError("a weight-update session is already open; call end_weight_update() first")
        self._session_open = True

    def end_weight_update(self) -> None:
        if not self._session_open:
            raise ModelLoadError("no weight-update session is open; call begin_weight_update() first")
        self._session_open = False

    def _require_session(self, operation: str) -> None:
        if not self._session_open:
            raise ModelLoadError(
                f"{operation} must run between begin_weight_update() and end_weight_update() "
                "(a weight-update session)"
            )

    async def update_weights_from_tensor(self, request: engine_api.UpdateWeightsFromTensorRequest) -> int:
        self._require_session("update_weights_from_tensor")
        if request.load_format != GYRE_SAFETENSORS_FORMAT:
            raise ModelLoadError(
                f"the reference engine takes load_format={GYRE_SAFETENSORS_FORMAT!r} only "
                "(it never unpickles request bodies)"
            )
        tensors: dict[str, torch.Tensor] = {}
        try:
            for payload in request.serialized_named_tensors[:1]:  # one TP rank
                tensors.update(deserialize_safetensors(payload))
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc

        def job() -> int:
            return self._install(tensors, request.weight_version)

        return await self._exclusive(job, abort_all=request.abort_all_requests)

    async def init_weights_update_group(self, request: engine_api.InitWeightsUpdateGroupRequest) -> None:
        if request.backend != "gloo":
            raise ModelLoadError(f"the reference engine joins gloo groups only, not {request.backend!r}")
        if request.group_name in self._groups:
            raise ModelLoadError(f"group {request.group_name!r} already exists")

        def join() -> WeightUpdateGroup:
            return WeightUpdateGroup(
                master_address=request.master_address,
                master_port=request.master_port,
                rank=request.rank_offset,
                world_size=request.world_size,
                group_name=request.group_name,
            )

        try:
            self._groups[request.group_name] = await asyncio.to_thread(join)
        except (RuntimeError, ValueError) as exc:
            raise ModelLoadError(f"cannot join {request.group_name!r}: {exc}") from exc

    def destroy_weights_update_group(self, group_name: str) -> None:
        group = self._groups.pop(group_name, None)
        if group is None:
            raise ModelLoadError("The group to be destroyed does not exist.")
        group.close()

    async def update_weights_from_distributed(
        self, request: engine_api.UpdateWeightsFromDistributedRequest
    ) -> int:
        # SGLang checks the session before it receives anything; so does this.
        self._require_session("update_weights_from_distributed")
        if request.load_format is not None:
            raise ModelLoadError(f"the reference engine receives plain tensors, not {request.load_format!r}")
        group = self._groups.get(request.group_name)
        if group is None:
            raise ModelLoadError(f"no group {request.group_name!r}: call /init_weights_update_group first")
        if not len(request.names) == len(request.dtypes) == len(request.shapes):
            raise ModelLoadError("names, dtypes and shapes must have the same length")
        try:
            specs = [
                (name, dtype_from_name(dtype), tuple(shape))
                for name, dtype, shape in zip(request.names, request.dtypes, request.shapes, strict=True)
            ]
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc

        def job() -> int:
            # Receive every tensor first: the sender broadcasts them all regardless.
            received = {
                name: group.broadcast(torch.empty(shape, dtype=dtype)) for name, dtype, shape in specs
            }
            return self._install(received, request.weight_version)

        return await self._exclusive(job, abort_all=request.abort_all_requests)

    def set_weight_version(self, version: str) -> None:
        self.loop.weight_version = version
