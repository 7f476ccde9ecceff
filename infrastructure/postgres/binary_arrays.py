"""A several-event append's six arrays, encoded in PostgreSQL's binary array form by hand.

An append of several events (a batch of assignments: each task and its agent) passes six
arrays to the append function. psycopg dumps a Python list element by element through its
list dumper, in Python; building the same bytes here is a ``struct`` header and a join.
The arrays are wrapped in ``BinaryArray``, whose dumper hands the bytes over unchanged, and
the server reads each as the type of the function's parameter.

Binary array layout (PostgreSQL's ``array_recv``): number of dimensions, a has-nulls flag,
the element type's oid, then per dimension its length and lower bound (1), then each
element as a 4-byte length (-1 for NULL) and its bytes in the element type's binary form:
uuid its 16 bytes, int8 8 bytes big-endian, text its UTF-8, bytea the bytes themselves.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import cast
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg.adapt import Dumper
from psycopg.pq import Format

_HEADER = struct.Struct("!iiiii")  # dimensions, has nulls, element oid, length, lower bound
_LENGTH = struct.Struct("!i")
_INT8 = struct.Struct("!q")
_NULL = _LENGTH.pack(-1)
_UUID_OID, _INT8_OID, _TEXT_OID, _BYTEA_OID = 2950, 20, 25, 17  # the element types


class BinaryArray(bytes):
    """A one-dimensional array already in PostgreSQL's binary form (sent as it is)."""


class _BinaryArrayDumper(Dumper):
    format = Format.BINARY
    # No oid: the server takes the function parameter's type (uuid[], bigint[], text[],
    # bytea[]); a fixed oid would also register this dumper for that oid's lookups.

    def dump(self, obj: BinaryArray) -> bytes:
        return obj


# psycopg's global map, which every connection copies: it adds a dumper for this module's
# own class only (no oid, so no lookup by oid changes), and any cursor can send the arrays.
psycopg.adapters.register_dumper(BinaryArray, _BinaryArrayDumper)


def array(element_oid: int, items: Sequence[bytes | None]) -> BinaryArray:
    """``items`` (each already in the element type's binary form, or None) as one array."""
    parts = [_HEADER.pack(1, 1 if None in items else 0, element_oid, len(items), 1)]
    for item in items:
        if item is None:
            parts.append(_NULL)
        else:
            parts.append(_LENGTH.pack(len(item)))
            parts.append(item)
    return BinaryArray(b"".join(parts))


def uuids(items: Sequence[UUID]) -> BinaryArray:
    """A ``uuid[]`` parameter."""
    return array(_UUID_OID, [item.bytes for item in items])


def int8s(items: Sequence[int]) -> BinaryArray:
    """A ``bigint[]`` parameter."""
    return array(_INT8_OID, [_INT8.pack(item) for item in items])


Encoder = Callable[
    [Sequence[StoredEvent], Sequence[bytes | None], Sequence[bytes | None]], tuple[BinaryArray, ...] | None
]
"""What ``append_arrays`` is: the recorder holds one (or None, psycopg's lists)."""


def append_arrays(
    events: Sequence[StoredEvent], hashes: Sequence[bytes | None], macs: Sequence[bytes | None]
) -> tuple[BinaryArray, ...] | None:
    """The append function's six arrays for ``events``; None unless every id is a UUID (a
    text-id log keeps psycopg's own list dumping)."""
    if not all(type(e.originator_id) is UUID for e in events):
        return None
    return (
        array(_UUID_OID, [cast(UUID, e.originator_id).bytes for e in events]),
        array(_INT8_OID, [_INT8.pack(e.originator_version) for e in events]),
        array(_TEXT_OID, [e.topic.encode() for e in events]),
        array(_BYTEA_OID, [e.state for e in events]),
        array(_BYTEA_OID, hashes),
        array(_BYTEA_OID, macs),
    )
