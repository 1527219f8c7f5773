"""A valid example of every registered event type, built from its msgspec type information.

Used by the event-vocabulary tests: they append one event of each type and read them back,
so a type added to any catalog is covered without a hand-written example. Fields with
constraints get values inside them; a few field types need a real value (a feasible
scheduler config, a model call's token arrays) and are given one here.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np

from gyre_sched import SchedConfig
from gyre_store import Event, EventRegistry, ModelCallRecorded, NewEvent, Provenance, TitoArrays, new_record

HEX64 = "0123456789abcdef" * 4


def _value(t: mi.Type) -> Any:
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 1)
        return low
    if isinstance(t, mi.FloatType):
        return 0.5 if (t.le is None or t.le >= 0.5) and (t.ge is None or t.ge <= 0.5) else (t.ge or 0.0)
    if isinstance(t, mi.StrType):
        if t.pattern == "^[0-9a-f]{64}$":
            return HEX64
        plain = "x" * max(1, t.min_length or 0)
        if t.pattern is not None and re.fullmatch(t.pattern, plain) is None:
            raise NotImplementedError(f"no example for a string matching {t.pattern!r}: add one here")
        return plain
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.EnumType):
        member: enum.Enum = next(iter(t.cls))
        return member
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.NoneType):
        return None
    if isinstance(t, mi.UnionType):
        return _value(next(x for x in t.types if not isinstance(x, mi.NoneType)))
    if isinstance(t, mi.StructType):
        if t.cls is SchedConfig:
            return SchedConfig(
                cells=2, cell_capacity=4, group_size=2, batch_groups=2, phi=0.5, mu=1
            ).validate()
        return t.cls(**{f.name: _value(f.type) for f in t.fields})
    if isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        item = _value(t.item_type)
        return {mi.ListType: list, mi.VarTupleType: tuple, mi.SetType: set, mi.FrozenSetType: frozenset}[
            type(t)
        ]([item])
    if isinstance(t, mi.TupleType):
        return tuple(_value(x) for x in t.item_types)
    if isinstance(t, mi.DictType):
        return {_value(t.key_type): _value(t.value_type)}
    if isinstance(t, mi.RawType):
        return msgspec.Raw(b"{}")
    if isinstance(t, mi.AnyType):
        return "any"
    raise NotImplementedError(f"no example for msgspec type {t!r}: add one here")


def example_event(cls: type[Event]) -> Event:
    """An instance of ``cls`` whose every field holds a valid value."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return cls(**{f.name: _value(f.type) for f in info.fields})


def _arrays() -> TitoArrays:
    return TitoArrays(
        input_ids=np.array([1, 2, 3], "<i4"), input_prov=np.array([Provenance.SYSTEM] * 3, "|u1"),
        msg_ends=np.zeros(0, "<i4"), msg_hashes=np.zeros(0, "<u4"), output_ids=np.array([7, 8], "<i4"),
        output_logprobs=np.full(2, -0.25, "<f4"), output_prov=np.full(2, Provenance.SAMPLED, "|u1"),
        output_trainable=np.ones(2, np.bool_), output_hash=np.zeros(0, "<u4"),
    )  # fmt: skip


def example_events(registry: EventRegistry) -> list[NewEvent]:
    """One NewEvent of every type in ``registry`` (a model call carries its token arrays)."""
    out: list[NewEvent] = []
    for cls in sorted(registry.types(), key=lambda c: c.event_type):
        if cls is ModelCallRecorded:
            call = ModelCallRecorded(execution_id="x", run_id="x", request_id="r1")
            out.append(new_record(call, _arrays()))
        else:
            out.append(NewEvent(example_event(cls)))
    return out
