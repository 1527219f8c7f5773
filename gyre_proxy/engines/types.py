"""The engine seam: what the proxy asks of any inference engine, in domain types.

``Engine`` is the interface the proxy routes to; ``EngineClient`` (SGLang's HTTP API, real
server or gyre's reference engine) and ``testing.FakeEngine`` implement it. Results carry
token ids as int32 and behaviour logprobs as float32 arrays, the form TITO records store.
This module holds no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gyre_proxy.engines import wire as engine_api

TokenIds = npt.NDArray[np.int32]
Logprobs = npt.NDArray[np.float32]


class FinishKind(enum.Enum):
    """Why generation ended, as SGLang's ``finish_reason.type`` names it."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True)
class Finish:
    """A finish reason: ``matched`` is the stop token id for STOP, ``message`` set for ABORT."""

    kind: FinishKind
    matched: int | str | None = None
    message: str | None = None

    @classmethod
    def from_wire(cls, wire: engine_api.FinishReason) -> Finish:
        return cls(kind=FinishKind(wire.type), matched=wire.matched, message=wire.message)

    def to_wire(self, *, length: int | None = None) -> engine_api.FinishReason:
        return engine_api.FinishReason(
            type=self.kind.value,
            matched=self.matched,
            length=length if self.kind is FinishKind.LENGTH else None,
            message=self.message,
        )


@dataclass(frozen=True)
class SamplingConfig:
    """How to decode one request. ``temperature == 0`` is greedy; ``seed`` makes sampling repeatable."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def to_wire(self) -> engine_api.SamplingParams:
        return engine_api.SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=list(self.stop_token_ids) or None,
            ignore_eos=self.ignore_eos or None,
            sampling_seed=self.seed,
        )

    @classmethod
    def from_wire(cls, wire: engine_api.SamplingParams) -> SamplingConfig:
        return cls(
            max_new_tokens=16 if wire.max_new_tokens is None else wire.max_new_tokens,
            temperature=1.0 if wire.temperature is None else wire.temperature,
            top_p=1.0 if wire.top_p is None else wire.top_p,
            top_k=-1 if wire.top_k is None else wire.top_k,
            stop_token_ids=tuple(wire.stop_token_ids or ()),
            ignore_eos=bool(wire.ignore_eos),
            seed=wire.sampling_seed,
        )


def _empty_ids() -> TokenIds:
    return np.zeros(0, dtype=np.int32)


def _empty_logprobs() -> Logprobs:
    return np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class GenerateResult:
    """A finished generation: every output token, its behaviour logprob and the weight version."""

    rid: str
    output_ids: TokenIds
    logprobs: Logprobs
    finish: Finish
    weight_version: str
    prompt_tokens: int
    text: str | None = None


@dataclass(frozen=True, eq=False)
class GenerateDelta:
    """One streamed increment: the new tokens only; ``finish`` is set on the last one."""

    rid: str
    output_ids: TokenIds = field(default_factory=_empty_ids)
    logprobs: Logprobs = field(default_factory=_empty_logprobs)
    finish: Finish | None = None
    weight_version: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What an engine says about itself."""

    model_path: str
    weight_version: str | None
    context_length: int | None = None


@dataclass(frozen=True)
class WeightUpdate:
    """Outcome of a successful weight update."""

    message: str
    weight_version: str | None


# -- KV-cache migration ------------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedKv:
    """A request aborted on its engine with its KV kept there under ``rid`` until released."""

    rid: str
    num_tokens: int  # its input ids and every token it produced
    nbytes: int
    weight_version: str


@dataclass(frozen=True, eq=False)
class KvPayload:
    """An exported KV cache: the payload bytes as the engine wrote them (safetensors, see
    ``wire.read_kv_payload``), and what its header says."""

    data: bytes
    rid: str
    token_ids: TokenIds  # the positions it covers, in order
    weight_version: str

    @classmethod
    def from_bytes(cls, data: bytes) -> KvPayload:
        """Read the header of ``data``; raises ``ValueError`` when it is not a KV payload."""
        header = engine_api.read_kv_payload(data)
        return cls(data, header.meta.rid, header.token_ids, header.meta.weight_version)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class ImportedKv:
    """A KV payload kept by the destination as a prefix-cache entry under ``key``."""

    key: str
    num_tokens: int
    nbytes: int


@dataclass(frozen=True)
class ExposedKv:
    """A pinned request's payload registered with its engine's Mooncake Transfer Engine, for a
    destination to read (``pull_kv``) until the source releases the pin."""

    rid: str
    num_tokens: int
    weight_version: str
    nbytes: int
    segment: str  # the source's Transfer Engine, "host:rpc_port"
    address: int  # where the payload starts in the source's memory
    protocol: str  # "tcp", or "rdma" on a cluster

    @classmethod
    def from_wire(cls, wire: engine_api.KvTransferDescriptor) -> ExposedKv:
        return cls(
            wire.rid, wire.num_tokens, wire.weight_version, wire.nbytes, wire.segment, wire.address,
            wire.protocol,
        )  # fmt: skip

    def to_wire(self) -> engine_api.KvTransferDescriptor:
        return engine_api.KvTransferDescriptor(
            rid=self.rid, num_tokens=self.num_tokens, weight_version=self.weight_version,
            nbytes=self.nbytes, segment=self.segment, address=self.address, protocol=self.protocol,
        )  # fmt: skip


@runtime_checkable
class Engine(Protocol):
    """An inference engine the proxy can route model calls to.

    ``generate`` returns a result even when the engine aborted the request (finish ABORT with
    the tokens produced so far) so that the caller can record them and retry elsewhere.
    """

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> GenerateResult: ...

    def generate_stream(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> AsyncIterator[GenerateDelta]: ...

    async def abort(self, rid: str) -> None: ...

    async def health(self) -> bool: ...

    async def model_info(self) -> EngineInfo: ...

    async def update_weights_from_disk(self, model_path: str, *, weight_version: str) -> WeightUpdate: ...
