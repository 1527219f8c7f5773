"""Typed events, the registry's validation and upcasters, and binary payloads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gyre_store import Event, EventRegistry, MalformedEvent, NewEvent, Payload, UnknownEventType


def make_registries() -> tuple[EventRegistry, EventRegistry]:
    old, new = EventRegistry(), EventRegistry()

    @old.register("thing.happened", stream="thing", key="thing_id", version=1)
    class ThingV1(Event, frozen=True, kw_only=True):
        thing_id: str
        size: int

    @new.register("thing.happened", stream="thing", key="thing_id", version=2)
    class ThingV2(Event, frozen=True, kw_only=True):
        thing_id: str
        size_bytes: int
        unit: str

    @new.upcaster("thing.happened", from_version=1)
    def v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
        return {"thing_id": body["thing_id"], "size_bytes": body["size"] * 1024, "unit": "B"}

    return old, new


def test_upcaster_turns_an_old_body_into_the_current_type() -> None:
    old, new = make_registries()
    old_event = old.type_of("thing.happened")(thing_id="t", size=2)  # type: ignore[call-arg]
    encoded = old.encode(NewEvent(old_event))
    assert encoded.schema_version == 1
    upcast = new.from_body("thing.happened", 1, encoded.body)
    assert type(upcast) is new.type_of("thing.happened")
    assert upcast.size_bytes == 2048 and upcast.unit == "B"  # type: ignore[attr-defined]


def test_missing_upcaster_and_future_versions_are_clear_errors() -> None:
    old, _ = make_registries()
    with pytest.raises(UnknownEventType, match="newer than this code"):
        old.from_body("thing.happened", 3, b"{}")
    lone = EventRegistry()

    @lone.register("x.y", stream="x", key="a", version=3)
    class X(Event, frozen=True, kw_only=True):
        a: str

    with pytest.raises(UnknownEventType, match="no upcaster"):
        lone.from_body("x.y", 1, b'{"a": "1"}')


def test_registry_refuses_bad_declarations() -> None:
    reg = EventRegistry()
    with pytest.raises(ValueError, match="stream key"):

        @reg.register("a.b", stream="a", key="missing")
        class A(Event, frozen=True, kw_only=True):
            present: str

    @reg.register("c.d", stream="c", key="k")
    class C(Event, frozen=True, kw_only=True):
        k: str

    with pytest.raises(ValueError, match="twice"):
        reg.register("c.d", stream="c", key="k")(C)


def test_unknown_fields_in_an_incoming_body_are_rejected() -> None:
    _, new = make_registries()
    with pytest.raises(MalformedEvent, match=r"unknown field"):
        new.from_dict("thing.happened", {"thing_id": "t", "size_bytes": 1, "unit": "B", "extra": 1})
    with pytest.raises(MalformedEvent, match="required"):
        new.from_dict("thing.happened", {"thing_id": "t"})


arrays = st.dictionaries(
    st.text(min_size=1, max_size=12),
    st.one_of(
        hnp.arrays(np.int32, st.integers(0, 300)),
        hnp.arrays(np.float32, st.integers(0, 300), elements=st.floats(width=32, allow_nan=True)),
        hnp.arrays(np.bool_, st.integers(0, 50)),
    ),
    max_size=4,
)


@given(arrays)
def test_payload_round_trips_bit_exactly(data: dict[str, np.ndarray[Any, Any]]) -> None:
    payload = Payload(data)
    back = Payload.decode(payload.encode())
    assert list(back) == list(data)
    for name, array in data.items():
        assert back[name].dtype == array.dtype
        assert back[name].tobytes() == array.tobytes()
    assert back == payload


@given(arrays)
def test_payload_layout_names_where_each_array_lies_in_the_stored_bytes(
    data: dict[str, np.ndarray[Any, Any]],
) -> None:
    payload = Payload(data)
    blob = payload.encode()
    layout = payload.layout()
    assert list(layout) == list(data)
    for name, array in data.items():
        at = layout[name]
        assert blob[at : at + array.nbytes] == array.tobytes()
    assert Payload.decode(blob).layout() == layout  # the same offsets from a payload read back


def test_payload_is_compact_and_rejects_what_it_cannot_store() -> None:
    ids = np.arange(2048, dtype=np.int32)
    lp = np.zeros(2048, dtype=np.float32)
    blob = Payload(input_ids=ids, logprobs=lp).encode()
    assert len(blob) < 2048 * 8 + 64  # 4 bytes a token id, 4 a logprob, a small header
    with pytest.raises(MalformedEvent, match="one-dimensional"):
        Payload(x=np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(MalformedEvent, match="dtype"):
        Payload(x=np.array(["a"]))
    with pytest.raises(MalformedEvent, match="GYP1"):
        Payload.decode(b"nope")
    with pytest.raises(MalformedEvent, match="truncated"):
        Payload.decode(Payload(x=ids).encode()[:-4])
