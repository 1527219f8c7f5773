"""Typed, versioned events and the registry that validates them.

An event type is a frozen ``msgspec.Struct`` registered under a dotted name and a schema
version. The registry turns bodies into typed events and back, rejects unknown types and
malformed bodies before anything reaches the database, and upcasts bodies written under
older schema versions. It knows nothing of SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeVar

import msgspec

from gyre_store.exceptions import MalformedEvent, PayloadTooLarge, StreamVersionConflict, UnknownEventType
from gyre_store.log.payload import Payload


class Event(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every event body. Subclasses are registered with :meth:`EventRegistry.register`."""

    event_type: ClassVar[str]
    schema_version: ClassVar[int]
    stream_type: ClassVar[str]
    stream_key: ClassVar[tuple[str, ...]]

    @property
    def stream(self) -> StreamId:
        """The stream this event belongs to, derived from the fields named by ``stream_key``."""
        return StreamId(self.stream_type, "/".join(str(getattr(self, k)) for k in self.stream_key))


class OpaqueEvent(Event, frozen=True, kw_only=True):
    """A stored event whose type this process does not know (its module is not imported).

    Reading the whole log never fails on such an event; writing one is still refused.
    """

    type_name: str
    version: int
    body: msgspec.Raw

    @property
    def stream(self) -> StreamId:
        raise UnknownEventType(f"{self.type_name} is not registered in this process")


@dataclass(frozen=True, slots=True, order=True)
class StreamId:
    """A stream: its type (``execution``, ``cell``, ...) and its id within that type."""

    type: str
    id: str

    def __str__(self) -> str:
        return f"{self.type}:{self.id}"


@dataclass(frozen=True, slots=True)
class EventMetadata:
    """Who caused an event and under which run and policy version."""

    correlation_id: uuid.UUID | None = None
    causation_id: uuid.UUID | None = None
    run_id: str | None = None
    policy_version: int | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended.

    ``expected_version`` is the version its stream must have just before this event is
    written (0: the stream must not exist yet; None: any). ``idempotency_key`` makes a
    repeated append a no-op that returns the original position.
    """

    event: Event
    idempotency_key: str | None = None
    payload: Payload | None = None
    metadata: EventMetadata = field(default_factory=EventMetadata)
    expected_version: int | None = None
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)

    @property
    def stream(self) -> StreamId:
        return self.event.stream


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: its global position, stream version and decoded body."""

    position: int
    stream: StreamId
    stream_version: int
    event_type: str
    schema_version: int
    event_id: uuid.UUID
    idempotency_key: str | None
    event: Event
    payload: Payload | None
    metadata: EventMetadata
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one appended event landed; ``duplicate`` when its idempotency key was seen before."""

    position: int
    stream_version: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A validated event ready for a storage adapter: body as JSON bytes, payload as bytes."""

    new: NewEvent
    stream: StreamId
    event_type: str
    schema_version: int
    body: bytes
    payload: bytes | None
    metadata: EventMetadata


E = TypeVar("E", bound=type[Event])
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits enforced before anything is sent to the database."""

    max_body_bytes: int = 1 << 20
    max_payload_bytes: int = 64 << 20


class EventRegistry:
    """The event types a store accepts, with their schema versions and upcasters."""

    def __init__(self) -> None:
        self._types: dict[str, type[Event]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._decoders: dict[str, msgspec.json.Decoder[Any]] = {}
        self._encoder = msgspec.json.Encoder()

    def register(
        self, name: str, *, stream: str, key: str | tuple[str, ...], version: int = 1
    ) -> Callable[[E], E]:
        """Class decorator: register an event type under ``name`` at schema ``version``."""

        def decorate(cls: E) -> E:
            if name in self._types:
                raise ValueError(f"event type {name!r} is registered twice")
            keys = (key,) if isinstance(key, str) else key
            missing = [k for k in keys if k not in cls.__struct_fields__]
            if missing:
                raise ValueError(f"event type {name!r}: stream key field(s) {missing} are not fields")
            cls.event_type = name
            cls.schema_version = version
            cls.stream_type = stream
            cls.stream_key = keys
            self._types[name] = cls
            self._decoders[name] = msgspec.json.Decoder(cls)
            return cls

        return decorate

    def upcaster(self, name: str, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register a function turning a body at ``from_version`` into one at ``from_version + 1``."""

        def decorate(fn: Upcaster) -> Upcaster:
            self._upcasters[(name, from_version)] = fn
            return fn

        return decorate

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def types(self) -> Iterable[type[Event]]:
        return self._types.values()

    def type_of(self, name: str) -> type[Event]:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownEventType(
                f"unknown event type {name!r}; registered types are: {', '.join(sorted(self._types))}"
            ) from None

    def encode(self, new: NewEvent, limits: Limits = Limits()) -> EncodedEvent:
        """Validate ``new`` and encode its body and payload, or raise an EventValidationError."""
        event = new.event
        cls = type(event)
        if self._types.get(getattr(cls, "event_type", "")) is not cls:
            raise UnknownEventType(f"{cls.__name__} is not a registered event type of this store")
        try:
            body = self._encoder.encode(event)
            # Structs do not type-check on construction; decoding back with the type does.
            self._decoders[cls.event_type].decode(body)
        except (msgspec.ValidationError, msgspec.EncodeError, TypeError) as exc:
            raise MalformedEvent(f"{cls.event_type} v{cls.schema_version}: {exc}") from exc
        if len(body) > limits.max_body_bytes:
            raise PayloadTooLarge(
                f"{cls.event_type} body is {len(body)} bytes, over the {limits.max_body_bytes}-byte limit; "
                "put bulk data (token arrays) in the binary payload"
            )
        payload = new.payload.encode() if new.payload is not None else None
        if payload is not None and len(payload) > limits.max_payload_bytes:
            raise PayloadTooLarge(
                f"{cls.event_type} payload is {len(payload)} bytes, over the "
                f"{limits.max_payload_bytes}-byte limit"
            )
        if new.expected_version is not None and new.expected_version < 0:
            raise MalformedEvent(f"expected_version must be >= 0 or None, got {new.expected_version}")
        metadata = new.metadata
        run_id = getattr(event, "run_id", None)
        if metadata.run_id is None and isinstance(run_id, str):
            # Events that belong to a run are indexed by it without the caller repeating it.
            metadata = EventMetadata(
                metadata.correlation_id, metadata.causation_id, run_id, metadata.policy_version
            )
        return EncodedEvent(new, event.stream, cls.event_type, cls.schema_version, body, payload, metadata)

    def from_body(self, name: str, schema_version: int, body: bytes | str) -> Event:
        """Decode a stored or incoming body, upcasting it to the current schema version."""
        cls = self.type_of(name)
        try:
            if schema_version == cls.schema_version:
                return self._decoders[name].decode(body)  # type: ignore[no-any-return]
            if schema_version > cls.schema_version:
                raise UnknownEventType(
                    f"{name} v{schema_version} is newer than this code's v{cls.schema_version}; upgrade gyre"
                )
            raw: dict[str, Any] = msgspec.json.decode(body)
            for version in range(schema_version, cls.schema_version):
                upcast = self._upcasters.get((name, version))
                if upcast is None:
                    raise UnknownEventType(f"no upcaster registered for {name} v{version} -> v{version + 1}")
                raw = upcast(raw)
            return msgspec.convert(raw, cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise MalformedEvent(f"{name} v{schema_version}: {exc}") from exc

    def from_stored(self, name: str, schema_version: int, body: bytes | str) -> Event:
        """Decode a body read back from storage; unknown types come back as OpaqueEvent."""
        if name not in self._types:
            raw = body.encode() if isinstance(body, str) else bytes(body)
            return OpaqueEvent(type_name=name, version=schema_version, body=msgspec.Raw(raw))
        return self.from_body(name, schema_version, body)

    def from_dict(self, name: str, body: dict[str, Any], schema_version: int | None = None) -> Event:
        """Build a typed event from a plain mapping (a CLI or HTTP caller's input)."""
        cls = self.type_of(name)
        return self.from_body(name, schema_version or cls.schema_version, msgspec.json.encode(body))


REGISTRY = EventRegistry()
"""The store's registry: what a log decodes by default. ``gyre_store.catalog`` fills it with
every type the store holds; other packages register theirs explicitly."""


def plan_append(
    batch: Sequence[EncodedEvent],
    head: int,
    versions: dict[StreamId, int],
    existing: Mapping[str, AppendResult],
) -> list[AppendResult]:
    """Where each event of ``batch`` lands, given the log's head, stream versions and known keys.

    The one rule every storage adapter follows (PostgreSQL's append function applies the
    same one in SQL): a known or repeated idempotency key is a duplicate of the original;
    otherwise the event's expected version must equal its stream's version, and it takes
    the next position and the next stream version. ``versions`` is updated in place.
    Raises StreamVersionConflict, before anything is written.
    """
    results: list[AppendResult] = []
    seen: dict[str, AppendResult] = {}
    for e in batch:
        key = e.new.idempotency_key
        prior = None if key is None else (existing.get(key) or seen.get(key))
        if prior is not None:
            results.append(AppendResult(prior.position, prior.stream_version, duplicate=True))
            continue
        current = versions.get(e.stream, 0)
        expected = e.new.expected_version
        if expected is not None and expected != current:
            raise StreamVersionConflict(
                f"stream {e.stream} is at version {current}, expected {expected}",
                stream_type=e.stream.type,
                stream_id=e.stream.id,
                expected=expected,
                actual=current,
            )
        head += 1
        versions[e.stream] = current + 1
        result = AppendResult(head, current + 1, duplicate=False)
        if key is not None:
            seen[key] = result
        results.append(result)
    return results
