"""The in-memory FakeEngine behaves like an engine."""

from __future__ import annotations

import pytest

from gyre_proxy.engines import (
    ContextLengthExceeded,
    Engine,
    EngineClient,
    EngineClientConfig,
    EngineNotAccepting,
    FinishKind,
    SamplingConfig,
)
from gyre_proxy.engines.testing import FakeEngine

pytestmark = pytest.mark.anyio


def test_fake_and_http_client_implement_the_protocol() -> None:
    assert isinstance(FakeEngine(), Engine)
    assert isinstance(EngineClient(EngineClientConfig("http://x")), Engine)


async def test_scripted_outputs_and_stop() -> None:
    fake = FakeEngine(script=[[5, 6, 2], [7, 8, 9]], eos_token_id=2)
    first = await fake.generate([1], SamplingConfig())
    second = await fake.generate([1], SamplingConfig(max_new_tokens=2))
    assert first.output_ids.tolist() == [5, 6, 2] and first.finish.kind is FinishKind.STOP
    assert second.output_ids.tolist() == [7, 8] and second.finish.kind is FinishKind.LENGTH
    assert [call.input_ids for call in fake.calls] == [(1,), (1,)]


async def test_abort_mid_stream() -> None:
    fake = FakeEngine(script=[list(range(10, 40))], step_delay_s=0.001)
    seen = []
    async for delta in fake.generate_stream([1], SamplingConfig(), rid="r"):
        seen.append(delta)
        if len(seen) == 3:
            await fake.abort("r")
    assert seen[-1].finish is not None and seen[-1].finish.kind is FinishKind.ABORT
    assert len(seen) == 4


async def test_admission_and_context() -> None:
    fake = FakeEngine(context_length=10, accepting=False)
    with pytest.raises(EngineNotAccepting):
        await fake.generate([1], SamplingConfig(max_new_tokens=1))
    fake.accepting = True
    with pytest.raises(ContextLengthExceeded):
        await fake.generate([1] * 5, SamplingConfig(max_new_tokens=5))
    update = await fake.update_weights_from_disk("/w", weight_version="v9")
    assert update.weight_version == "v9" == (await fake.model_info()).weight_version
