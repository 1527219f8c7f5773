"""Binary payloads: named numpy arrays packed into one compact blob.

Token ids (int32) and logprobs (float32) of a model call travel as raw little-endian
arrays, never as JSON lists. Layout: magic ``GYP1``, a 4-byte header length, a msgpack
header ``[[name, dtype, length], ...]``, then each array's bytes in header order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

import msgspec
import numpy as np
import numpy.typing as npt

from gyre_store.exceptions import MalformedEvent

MAGIC = b"GYP1"
_ALLOWED_DTYPES = frozenset({"<i4", "<f4", "<i8", "<f8", "|u1", "|b1", "<i2", "<u4"})
_HEADER = msgspec.msgpack.Encoder()
_HEADER_DECODER = msgspec.msgpack.Decoder(list[tuple[str, str, int]])


class Payload(Mapping[str, npt.NDArray[np.generic]]):
    """An immutable mapping of names to 1-D numpy arrays."""

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[str, npt.ArrayLike] | None = None, **kwargs: npt.ArrayLike) -> None:
        merged: dict[str, npt.NDArray[np.generic]] = {}
        for name, value in {**(arrays or {}), **kwargs}.items():
            array = np.asarray(value)
            if array.ndim != 1:
                raise MalformedEvent(
                    f"payload array {name!r} must be one-dimensional, got shape {array.shape}"
                )
            dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
            if dtype.str not in _ALLOWED_DTYPES:
                raise MalformedEvent(
                    f"payload array {name!r} has dtype {array.dtype}; use one of int32, float32, int64, "
                    "float64, int16, uint32, uint8 or bool"
                )
            array = np.ascontiguousarray(array, dtype=dtype)
            array.flags.writeable = False
            merged[name] = array
        self._arrays = merged

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Payload):
            return NotImplemented
        return self._arrays.keys() == other._arrays.keys() and all(
            a.dtype == other._arrays[k].dtype
            and np.array_equal(a, other._arrays[k], equal_nan=a.dtype.kind == "f")
            for k, a in self._arrays.items()
        )

    def __hash__(self) -> int:
        return hash(tuple((k, a.tobytes()) for k, a in self._arrays.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={a.dtype}[{a.shape[0]}]" for k, a in self._arrays.items())
        return f"Payload({inner})"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def _header(self) -> bytes:
        return _HEADER.encode([(k, a.dtype.str, int(a.shape[0])) for k, a in self._arrays.items()])

    def layout(self) -> dict[str, int]:
        """The byte offset of each array in :meth:`encode`'s output (where its first element
        starts), so a reader of the stored blob (SQL's ``substring``, a slice) can take part
        of one array without decoding the header."""
        header = self._header()
        offset = 8 + len(header)
        out: dict[str, int] = {}
        for name, array in self._arrays.items():
            out[name] = offset
            offset += array.nbytes
        return out

    def encode(self) -> bytes:
        """The compact binary form stored in the ``payload`` column."""
        header = self._header()
        parts = [MAGIC, struct.pack("<I", len(header)), header]
        parts.extend(a.tobytes() for a in self._arrays.values())
        return b"".join(parts)

    @classmethod
    def decode(cls, blob: bytes | memoryview) -> Payload:
        """Rebuild a payload from :meth:`encode`'s output; arrays view ``blob`` without copying."""
        view = memoryview(blob)
        if bytes(view[:4]) != MAGIC or len(view) < 8:
            raise MalformedEvent("binary payload does not start with the GYP1 header")
        (header_len,) = struct.unpack_from("<I", view, 4)
        try:
            header = _HEADER_DECODER.decode(view[8 : 8 + header_len])
        except msgspec.DecodeError as exc:
            raise MalformedEvent(f"binary payload header is corrupt: {exc}") from exc
        offset = 8 + header_len
        arrays: dict[str, npt.NDArray[np.generic]] = {}
        for name, dtype_str, length in header:
            dtype = np.dtype(dtype_str)
            end = offset + dtype.itemsize * length
            if end > len(view):
                raise MalformedEvent(f"binary payload is truncated inside array {name!r}")
            arrays[name] = np.frombuffer(view[offset:end], dtype=dtype)
            offset = end
        payload = cls.__new__(cls)
        payload._arrays = arrays
        return payload
