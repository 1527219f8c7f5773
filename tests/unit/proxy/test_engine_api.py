"""Wire types: round trips, SGLang-shaped bodies, omitted defaults."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_proxy.engines import Finish, FinishKind, SamplingConfig
from gyre_proxy.engines import wire as engine_api

# An answer as SGLang 0.5 writes it, extra fields included.
SGLANG_ANSWER = {
    "text": "hi",
    "output_ids": [104, 105, 258],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop", "matched": 258},
        "prompt_tokens": 3,
        "weight_version": "default",
        "completion_tokens": 3,
        "cached_tokens": 0,
        "e2e_latency": 0.01,
        "output_token_logprobs": [[-0.5, 104, None], [-1.25, 105, None], [-0.125, 258, None]],
        "input_token_logprobs": [[None, 1, None]],
    },
}


def test_generate_request_omits_unset_fields() -> None:
    body = json.loads(engine_api.encode(engine_api.GenerateRequest(input_ids=[1, 2])))
    assert body == {"input_ids": [1, 2], "sampling_params": {}}


def test_sampling_config_round_trips_through_the_wire() -> None:
    config = SamplingConfig(
        max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=(3, 4), seed=1
    )
    wire = engine_api.decode(engine_api.encode(config.to_wire()), engine_api.SamplingParams)
    assert SamplingConfig.from_wire(wire) == config
    assert json.loads(engine_api.encode(config.to_wire()))["sampling_seed"] == 1


def test_sglang_answer_decodes_and_ignores_extra_fields() -> None:
    answer = engine_api.decode(json.dumps(SGLANG_ANSWER), engine_api.GenerateResponse)
    assert answer.output_ids == [104, 105, 258]
    assert answer.meta_info.finish_reason == engine_api.FinishReason(type="stop", matched=258)
    assert answer.meta_info.output_token_logprobs is not None
    assert answer.meta_info.output_token_logprobs[1] == (-1.25, 105, None)


@pytest.mark.parametrize(
    ("wire", "kind"),
    [
        ({"type": "length", "length": 16}, FinishKind.LENGTH),
        ({"type": "abort", "message": "Abort by /abort_request"}, FinishKind.ABORT),
        ({"type": "stop", "matched": "</s>"}, FinishKind.STOP),
    ],
)
def test_finish_reasons(wire: dict[str, object], kind: FinishKind) -> None:
    finish = Finish.from_wire(engine_api.decode(json.dumps(wire), engine_api.FinishReason))
    assert finish.kind is kind
    assert finish.to_wire(length=16).type == wire["type"]


def test_unknown_finish_type_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError):
        engine_api.decode('{"type": "paused"}', engine_api.FinishReason)


@given(
    ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50),
    rid=st.none() | st.text(max_size=20),
    stream=st.booleans(),
    max_new=st.none() | st.integers(0, 10_000),
)
def test_generate_request_round_trip(
    ids: list[int], rid: str | None, stream: bool, max_new: int | None
) -> None:
    request = engine_api.GenerateRequest(
        input_ids=ids,
        sampling_params=engine_api.SamplingParams(max_new_tokens=max_new),
        rid=rid,
        return_logprob=True,
        stream=stream,
    )
    assert engine_api.decode(engine_api.encode(request), engine_api.GenerateRequest) == request


def test_weight_update_bodies_use_sglang_names() -> None:
    body = json.loads(
        engine_api.encode(engine_api.UpdateWeightsFromDiskRequest(model_path="/m", weight_version="7"))
    )
    assert body == {"model_path": "/m", "weight_version": "7"}
    group = json.loads(
        engine_api.encode(
            engine_api.InitWeightsUpdateGroupRequest(
                master_address="h", master_port=1, rank_offset=1, world_size=2
            )
        )
    )
    assert set(group) == {
        "master_address",
        "master_port",
        "rank_offset",
        "world_size",
        "group_name",
        "backend",
    }


@pytest.mark.parametrize(
    "ids",
    [
        [5, 70_000, 0],
        (5, 70_000, 0),
        np.array([5, 70_000, 0], dtype=np.int32),
        [np.int32(5), np.int64(70_000), 0],
    ],
    ids=["list", "tuple", "int32 array", "numpy scalars"],
)
def test_input_ids_encode_as_plain_json_ints(ids: object) -> None:
    body = engine_api.GenerateRequest(input_ids=engine_api.token_list(ids))  # type: ignore[arg-type]
    assert engine_api.encode(body).startswith(b'{"input_ids":[5,70000,0],')
