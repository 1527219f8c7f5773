"""In-memory engine for tests of code that routes to engines (``FakeEngine``).

``FakeEngine`` implements the ``Engine`` protocol with no model and no I/O: each request
gets the next scripted output (or a deterministic one made from the prompt), every token
has a fixed logprob, and abort, admission and weight versions behave as on a real engine.
It records every call so tests can assert on what the proxy sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from gyre_proxy.engines.types import (
    EngineInfo,
    Finish,
    FinishKind,
    GenerateDelta,
    GenerateResult,
    SamplingConfig,
    WeightUpdate,
)
from gyre_proxy.exceptions import ContextLengthExceeded, EngineNotAccepting, EngineUnavailable

FAKE_LOGPROB = -0.5


@dataclass
class FakeCall:
    """One generate call as the fake engine received it."""

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingConfig


@dataclass
class FakeEngine:
    """An ``Engine`` whose outputs come from ``script`` (cycled) or from the prompt.

    ``step_delay_s`` paces streamed tokens so tests can abort mid-stream; ``eos_token_id``
    ends a scripted output with a STOP finish.
    """

    script: Sequence[Sequence[int]] = ()
    eos_token_id: int = 2
    context_length: int = 4096
    weight_version: str = "default"
    step_delay_s: float = 0.0
    accepting: bool = True
    healthy: bool = True
    calls: list[FakeCall] = field(default_factory=list)
    _next: int = 0
    _aborted: set[str] = field(default_factory=set)

    def _output_for(self, input_ids: Sequence[int]) -> list[int]:
        if self.script:
            output = list(self.script[self._next % len(self.script)])
            self._next += 1
            return output
        # Deterministic and prompt-dependent: the prompt reversed, then EOS.
        return [*reversed(input_ids), self.eos_token_id]

    def _admit(self, input_ids: Sequence[int], sampling: SamplingConfig, rid: str | None) -> FakeCall:
        if not self.healthy:
            raise EngineUnavailable("fake engine is down")
        if not self.accepting:
            raise EngineNotAccepting()
        if len(input_ids) + sampling.max_new_tokens >= self.context_length:
            raise ContextLengthExceeded(
                f"{len(input_ids)} input + {sampling.max_new_tokens} new tokens exceed the context length "
                f"({self.context_length} tokens)"
            )
        call = FakeCall(rid or uuid.uuid4().hex, tuple(input_ids), sampling)
        self.calls.append(call)
        return call

    async def _tokens(self, call: FakeCall) -> AsyncIterator[tuple[int | None, Finish | None]]:
        output = self._output_for(call.input_ids)
        stops = {self.eos_token_id, *call.sampling.stop_token_ids}
        for index, token in enumerate(output[: call.sampling.max_new_tokens]):
            if self.step_delay_s:
                await asyncio.sleep(self.step_delay_s)
            if call.rid in self._aborted:
                yield None, Finish(FinishKind.ABORT, message="Abort by /abort_request")
                return
            if token in stops:
                yield token, Finish(FinishKind.STOP, matched=token)
                return
            last = index + 1 == min(len(output), call.sampling.max_new_tokens)
            yield token, (Finish(FinishKind.LENGTH) if last else None)

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> GenerateResult:
        call = self._admit(input_ids, sampling, rid)
        ids: list[int] = []
        finish = Finish(FinishKind.LENGTH)
        async for token, end in self._tokens(call):
            if token is not None:
                ids.append(token)
            if end is not None:
                finish = end
        return GenerateResult(
            rid=call.rid,
            output_ids=np.array(ids, dtype=np.int32),
            logprobs=np.full(len(ids), FAKE_LOGPROB, dtype=np.float32),
            finish=finish,
            weight_version=self.weight_version,
            prompt_tokens=len(input_ids),
        )

    async def generate_stream(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> AsyncIterator[GenerateDelta]:
        call = self._admit(input_ids, sampling, rid)
        async for token, end in self._tokens(call):
            ids = [] if token is None else [token]
            yield GenerateDelta(
                rid=call.rid,
                output_ids=np.array(ids, dtype=np.int32),
                logprobs=np.full(len(ids), FAKE_LOGPROB, dtype=np.float32),
                finish=end,
                weight_version=self.weight_version,
            )

    async def abort(self, rid: str) -> None:
        self._aborted.add(rid)

    async def health(self) -> bool:
        return self.healthy

    async def model_info(self) -> EngineInfo:
        return EngineInfo("fake", self.weight_version, self.context_length)

    async def update_weights_from_disk(self, model_path: str, *, weight_version: str) -> WeightUpdate:
        self.weight_version = weight_version
        return WeightUpdate(f"loaded {model_path}", weight_version)
