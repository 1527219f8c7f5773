"""An engine's weight version names the policy version of the tokens it sampled, or nothing.

gyre's engines serve integer versions ("3"); a version that names none is refused as a typed
error, and the attempt's record in the log says why; it never becomes policy version 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gyre_proxy.answer import AnswerMachine, AnswerPipeline, Reroute, Router, Stage
from gyre_proxy.answer.machine import policy_version
from gyre_proxy.chat import ChatRequest, ExecutionAuth, Message, Role, TextBlock
from gyre_proxy.engines import GenerateDelta
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.exceptions import EngineProtocolError, WeightVersionInvalid
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool
from gyre_store import InMemoryEventLog
from gyre_store.catalog import CallFinish, ModelCallRecorded
from gyre_store.trees import TrajectoryRecorder

pytestmark = pytest.mark.anyio

AUTH = ExecutionAuth("ex", "run", "generic")
REQUEST = ChatRequest(system="s", messages=(Message(Role.USER, (TextBlock("go"),)),), max_tokens=20)


@pytest.mark.parametrize(
    ("reported", "version"), [("3", 3), ("007", 7), ("0", 0), (None, None), ("default", None)]
)
def test_integer_versions_are_read_and_missing_ones_name_none(
    reported: str | None, version: int | None
) -> None:
    assert policy_version(reported) == version


@pytest.mark.parametrize("reported", ["abc", "1.5", "", "-1", " 3", "+3", "3_0", "٣"])
def test_a_version_that_is_not_an_integer_is_refused(reported: str) -> None:
    with pytest.raises(WeightVersionInvalid, match="not an integer policy version") as refused:
        policy_version(reported)
    assert isinstance(refused.value, EngineProtocolError)  # handled like any engine protocol error


def pipeline_over(template: Qwen3Template, engines: Sequence[tuple[str, FakeEngine]]) -> AnswerPipeline:
    recorder = TrajectoryRecorder(InMemoryEventLog())
    return AnswerPipeline(
        Ingestor(recorder, template, GenericHarness()),
        Router(engines),
        RecordSpool(recorder),
    )


def records(pipeline: AnswerPipeline) -> list[ModelCallRecorded]:
    assert pipeline.spool.flush(10)
    pipeline.spool.close()
    log = pipeline.ingestor.recorder.log
    return [ev.event for ev in log.read(0) if isinstance(ev.event, ModelCallRecorded)]


def answer_of(template: Qwen3Template) -> list[int]:
    return [*template.tok.encode("Done."), template.tok.special("<|im_end|>")]


@pytest.mark.parametrize("reported", ["abc", "1.5"])
async def test_a_bad_version_is_refused_recorded_on_the_call_and_the_answer_goes_on(
    template: Qwen3Template, reported: str
) -> None:
    bad = FakeEngine(script=[answer_of(template)], weight_version=reported)
    good = FakeEngine(script=[answer_of(template)], weight_version="3")
    pipeline = pipeline_over(template, [("a-bad", bad), ("b-good", good)])
    response = await pipeline.complete(AUTH, REQUEST)
    assert response.blocks == (TextBlock("Done."),)  # the harness sees one answer
    refused, answered = records(pipeline)
    # The refused attempt: nothing of its delta taken, aborted on its engine, and the why kept.
    assert (refused.engine, refused.finish, refused.weight_versions) == ("a-bad", CallFinish.ABORT, ())
    assert refused.detail.startswith("WeightVersionInvalid:") and repr(reported) in refused.detail
    assert bad._aborted == {refused.request_id}
    assert (answered.engine, answered.retry_of, answered.weight_versions) == (
        "b-good",
        refused.request_id,
        ((0, 3),),
    )
    assert answered.detail == ""


async def test_an_engine_that_names_no_version_leaves_the_record_without_one(template: Qwen3Template) -> None:
    pipeline = pipeline_over(
        template, [("e", FakeEngine(script=[answer_of(template)], weight_version="default"))]
    )
    await pipeline.complete(AUTH, REQUEST)
    [record] = records(pipeline)
    # No span: the policy version is unknown (NULL in gyre_records), not 0.
    assert record.finish is CallFinish.STOP and record.weight_versions == ()


def test_a_version_lost_mid_answer_is_refused(template: Qwen3Template) -> None:
    ingestor = pipeline_over(template, []).ingestor
    prepared = ingestor.prepare("ex", "run", REQUEST)
    tok = template.tok
    machine = AnswerMachine(
        REQUEST,
        prepared,
        prepared.encoded.new_ids,
        request_id="r",
        tokenizer=tok,
        stop_ids=(tok.special("<|im_end|>"),),
    )
    machine.start("e")
    ids = np.asarray(tok.encode("ab"), dtype=np.int32)
    lp = np.zeros(ids.shape[0], dtype=np.float32)
    machine.on_delta(GenerateDelta("r", ids, lp, None, "3"))
    with pytest.raises(WeightVersionInvalid, match="after version 3"):
        machine.on_delta(GenerateDelta("r", ids, lp, None, None))
    machine.fail("refused")
    refused, reroute = machine.end_attempt()
    assert isinstance(refused, Stage) and reroute == Reroute("e")
    assert (
        refused.detail == "refused"
        and refused.weight_versions == ((0, 3),)
        and len(refused.output_ids) == ids.shape[0]
    )
