"""Sealing personal fields: the mapper encrypts them per session under its data key.

Every session gets a random 256-bit data key when its ``Started`` event is encoded, kept
in a key table tagged with the session's tenant and user (``DataKeys``). The fields
``domain/personal.py`` names are taken out of the event's state, encoded by the same
transcoder, encrypted with AES-GCM (a fresh 96-bit nonce each time) and stored in the
payload as one ``_sealed`` value; the associated data binds the ciphertext to its stream,
version and topic, so a sealed value moved to another event does not open. Everything
else (step names, usage, cost, latency, times, idempotency keys) stays in the clear, so
totals, projections and the chain's hashes (over the stored bytes: the ciphertext) work
without any key. Session snapshots are sealed whole.

Destroying a session's key (``forget``) is the erasure: the events stay as they are, and
their sealed fields decode as the markers of ``domain/erased.py``. A stream that has no
key (written while sealing was off) is read and written in the clear.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Hashable, Sequence
from datetime import datetime
from enum import Enum
from functools import lru_cache
from types import UnionType
from typing import Any, Final, Protocol, Union, cast, get_args, get_origin, get_type_hints
from uuid import UUID

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import (
    Mapper,
    MapperDeserialisationError,
    StoredEvent,
    find_id_convertor,
)
from eventsourcing.utils import TopicError, get_topic, resolve_topic

from flowledger.domain.erased import erased_value
from flowledger.domain.errors import StoredEventUnreadable
from flowledger.domain.personal import PERSONAL_FIELDS
from flowledger.domain.session import Session
from flowledger.infrastructure.fast_json import StepEventMapper

SEALED: Final = "_sealed"
"""The payload key of the sealed fields (base64 of nonce and ciphertext; "" when written erased)."""
_SEALED_BYTES: Final = b'"_sealed":'
_NONCE_BYTES: Final = 12
KEY_BYTES: Final = 32


def _unreadable(stored: StoredEvent, reason: str) -> StoredEventUnreadable:
    return StoredEventUnreadable(str(stored.originator_id), stored.originator_version, stored.topic, reason)


_TOPIC_PREFIXES: Final = ("flowledger.", "eventsourcing.")
"""Where every stored topic points (events are flowledger's, snapshots the library's class or
flowledger's): a topic elsewhere is not resolved, which would import whatever module it names."""


def _malformed_row(stored: StoredEvent) -> str | None:
    """What is wrong with a row whose topic or payload is not there at all (NULL) or whose topic
    names nothing of flowledger's, else None. Each once raised a bare TypeError,
    AttributeError or KeyError out of every read of its stream."""
    if not isinstance(stored.topic, str):
        return "its topic is NULL"
    if not stored.state:
        return "its payload is empty (NULL)"
    if not stored.topic.startswith(_TOPIC_PREFIXES):
        return "its topic names no flowledger event"
    return None


_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD]")
"""How a JSON escape of a surrogate begins (one regex search: 0.5 us on a 650-byte payload,
where two ``in`` tests took 2.3 us). The encoders write every character as UTF-8, so a
payload holds one only if someone wrote it there (a string the domain refuses on the way in)."""


def _lone_surrogate(state: bytes) -> str | None:
    """What is wrong with a payload holding a lone surrogate escape (``\\ud800``), else None.

    Python's JSON decoder makes one a ``str`` that no UTF-8 writer accepts: a projection set
    the event aside with a UnicodeEncodeError, and every HTTP read of the session was a 500
    "internal error". Only a payload holding such an escape is decoded twice to find out."""
    if _SURROGATE_ESCAPE.search(state) is None:
        return None
    try:
        json.dumps(json.loads(state), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        bad = error.object[error.start : error.end].encode("unicode_escape").decode("ascii")
        return f"it holds a lone surrogate ({bad}), which is not a character"
    except ValueError:
        return None  # not JSON: the decode that follows says so
    return None


_REQUIRED_FIELDS: dict[type[object], frozenset[str]] = {}


def _required_fields(cls: type[object]) -> frozenset[str]:
    """The fields of an event class that have no default: every stored payload holds them
    (after upcasting). Kept per class: it is asked on every decode."""
    known = _REQUIRED_FIELDS.get(cls)
    if known is None:
        fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
        known = _REQUIRED_FIELDS[cls] = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
    return known


def is_sealed(stored: StoredEvent) -> bool:
    """Whether a stored event carries sealed fields (written by a sealing engine)."""
    return _SEALED_BYTES in stored.state


class Destroyed(Enum):
    """A key that existed and was destroyed: its stream's sealed fields are erased."""

    KEY = "destroyed"


DESTROYED: Final = Destroyed.KEY
DataKey = bytes | Destroyed | None
"""A stream's key, DESTROYED, or None (the stream has none: it is stored in the clear)."""


_PLAIN_TYPES: Final[dict[Any, tuple[type, ...]]] = {
    str: (str,),
    int: (int,),
    float: (int, float),  # JSON writes a whole float as an integer too
    bool: (bool,),
    datetime: (datetime,),
}
_FIELD_TYPES: dict[type[object], tuple[tuple[str, tuple[type, ...]], ...]] = {}


def _accepted(hint: Any) -> tuple[type, ...] | None:
    """The types a field annotated ``hint`` may hold, when that is checked with isinstance alone
    (plain values, dicts and lists, and their optional forms), else None (not checked)."""
    origin = get_origin(hint)
    if origin is Union or origin is UnionType:
        parts = [(type(None),) if arg is type(None) else _accepted(arg) for arg in get_args(hint)]
        return None if None in parts else tuple(t for part in parts if part is not None for t in part)
    if origin is dict or origin is list:
        return (origin,)
    return _PLAIN_TYPES.get(hint)


def _field_types(cls: type[object]) -> tuple[tuple[str, tuple[type, ...]], ...]:
    """The fields of an event class whose values ``_accepted`` checks, kept per class."""
    known = _FIELD_TYPES.get(cls)
    if known is None:
        try:
            hints = get_type_hints(cls)
        except (NameError, TypeError):
            hints = {}
        checks = ((name, _accepted(hint)) for name, hint in hints.items())
        known = _FIELD_TYPES[cls] = tuple((name, types) for name, types in checks if types is not None)
    return known


def _mistyped_field(cls: type[object], values: dict[str, Any]) -> str | None:
    """What is wrong with a decoded event whose field holds a value not of its type, else None.

    JSON edited in the database reads back whatever it holds: a step name that is a number
    went into the session's state (HTTP GET then a 500, the response refusing it), a stamp
    that is a string failed the next command's comparison of stamps with a TypeError."""
    for name, types in _field_types(cls):
        value = values.get(name)
        if name in values and not isinstance(value, types):
            expected = " or ".join(t.__name__ for t in types)
            return f"its {name} is {type(value).__name__} {_short(value)}, not {expected}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class DataKeys(Protocol):
    """Where data keys live (a table in PostgreSQL, or memory), each tagged with its user."""

    def key_of(self, stream_id: UUID) -> DataKey:
        """The stream's key (cached for a bounded time), DESTROYED, or None."""

    def create(self, stream_id: UUID, tenant: str, user_id: str | None) -> bytes | Destroyed:
        """The stream's key, made now unless it exists (a repeated start keeps the first)."""

    def tag(self, stream_id: UUID, user_id: str) -> None:
        """Tag a live key that has no user yet with ``user_id`` (a session restarted with one)."""

    def streams_of(self, tenant: str, user_id: str) -> list[UUID]:
        """The streams whose keys are tagged with this user and not destroyed."""

    def destroy(self, stream_ids: Sequence[UUID]) -> int:
        """Destroy the keys (and the user tags) of these streams, and drop their snapshots."""


class MemoryDataKeys:
    """Data keys of an in-memory engine."""

    def __init__(self) -> None:
        self._keys: dict[UUID, tuple[str, str | None, bytes] | Destroyed] = {}
        self._lock = threading.Lock()

    def key_of(self, stream_id: UUID) -> DataKey:
        """The stream's key, DESTROYED, or None."""
        held = self._keys.get(stream_id)
        return held if held is None or held is DESTROYED else held[2]

    def create(self, stream_id: UUID, tenant: str, user_id: str | None) -> bytes | Destroyed:
        """The stream's key, made now unless it exists."""
        with self._lock:
            held = self._keys.setdefault(stream_id, (tenant, user_id, new_data_key()))
        return held if held is DESTROYED else held[2]

    def tag(self, stream_id: UUID, user_id: str) -> None:
        """Tag a live key that has no user yet."""
        with self._lock:
            held = self._keys.get(stream_id)
            if held is not None and held is not DESTROYED and held[1] is None:
                self._keys[stream_id] = (held[0], user_id, held[2])

    def streams_of(self, tenant: str, user_id: str) -> list[UUID]:
        """The streams whose live keys carry this user."""
        return [s for s, k in self._keys.items() if k is not DESTROYED and k[:2] == (tenant, user_id)]

    def destroy(self, stream_ids: Sequence[UUID]) -> int:
        """Destroy these streams' keys (an in-memory engine takes no snapshots to drop)."""
        with self._lock:
            live = [s for s in stream_ids if self._keys.get(s, DESTROYED) is not DESTROYED]
            for stream_id in live:
                self._keys[stream_id] = DESTROYED
        return len(live)


class KeyCache:
    """Keys one engine read, each trusted for ``ttl_s`` seconds; a destroyed key is final.

    The bound of ``forget`` on other engines: a key another engine read just before it was
    destroyed stays usable there for at most ``ttl_s`` seconds.
    """

    def __init__(self, ttl_s: float, max_entries: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._entries: dict[UUID, tuple[DataKey, float]] = {}

    def get(self, stream_id: UUID) -> tuple[bool, DataKey]:
        """(True, key) when a live entry is held, else (False, None)."""
        entry = self._entries.get(stream_id)
        if entry is None:
            return False, None
        key, until = entry
        if key is DESTROYED or time.monotonic() < until:
            return True, key
        return False, None

    def put(self, stream_id: UUID, key: DataKey) -> None:
        """Hold ``key`` for the TTL (a destroyed one for good)."""
        if len(self._entries) >= self._max:
            self._entries.clear()  # rare; a miss costs one read
        self._entries[stream_id] = (key, time.monotonic() + self.ttl_s)


def new_data_key() -> bytes:
    """A fresh random 256-bit AES key."""
    return AESGCM.generate_key(bit_length=KEY_BYTES * 8)


@lru_cache(maxsize=4096)
def _cipher(key: bytes) -> AESGCM:
    """One AESGCM per key (its key schedule is worked out once)."""
    return AESGCM(key)


# Built once: json.dumps with options builds a new encoder on every call. Event fields
# that are sealed hold plain JSON (validated by the domain), so the library's transcoder
# (and its object hook on every nested dict) is needed only for snapshots.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _plain_json(secret: dict[str, Any]) -> bytes:
    """Sealed event fields are validated JSON: orjson writes them (the standard encoder a huge int)."""
    try:
        return orjson.dumps(secret)
    except TypeError:
        return _JSON.encode(secret).encode()


def _aad(originator_id: UUID | str, version: int, topic: str) -> bytes:
    """What a sealed value is bound to: its stream, version and topic."""
    stream = originator_id.bytes if isinstance(originator_id, UUID) else originator_id.encode()
    return stream + version.to_bytes(8, "big", signed=True) + topic.encode()


_SNAPSHOT = Session.Snapshot
_SNAPSHOT_FIELDS: Final = ("user_id", "metadata", "context", "history", "pending", "resolution", "failures")
"""The personal attributes of a session's state (its snapshot's ``state``); the rest (counts,
totals, the idempotency-key filter) stays in the clear and costs no decryption on a load."""


def _personal_fields(cls: type[Any]) -> tuple[str, ...]:
    if cls is _SNAPSHOT:
        return _SNAPSHOT_FIELDS
    return PERSONAL_FIELDS.get(cls, ())


class SealingMapper(StepEventMapper):
    """The library's mapper, sealing personal fields with the stream's data key.

    With ``seal`` False it writes every field in the clear (no key is looked up), and still
    opens what a sealing engine wrote.
    """

    def __init__(self, mapper: Mapper[UUID], *, keys: DataKeys, seal: bool = True) -> None:
        super().__init__(mapper)
        self.keys = keys
        self.seal = seal

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """The stored event, its personal fields sealed when the stream has a key."""
        cls = type(domain_event)
        fields = _personal_fields(cls)
        if not fields or not self.seal:
            return super().to_stored_event(domain_event)
        topic = get_topic(cls)
        state = dict(vars(domain_event))
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        class_version = getattr(cls, "class_version", 1)
        if class_version > 1:
            state["class_version"] = class_version
        self._seal(state, fields, cls, originator_id, originator_version, topic)
        return StoredEvent(
            originator_id=originator_id,
            originator_version=originator_version,
            topic=topic,
            state=self.encode_state(cls, state),
        )

    def _seal(
        self,
        state: dict[str, Any],
        fields: tuple[str, ...],
        cls: type[Any],
        stream: UUID,
        version: int,
        topic: str,
    ) -> None:
        if cls is Session.Started:
            key: DataKey = self.keys.create(stream, state["tenant"], state["user_id"])
        else:
            key = self.keys.key_of(stream)
            if cls is Session.Restarted and state.get("user_id") is not None and isinstance(key, bytes):
                self.keys.tag(stream, state["user_id"])  # forget finds the session by its new user
        if key is None:
            return  # a stream from before sealing (or sealing off): stored in the clear
        target = state
        if cls is _SNAPSHOT:
            target = state["state"] = dict(state["state"])  # the aggregate's own dict stays whole
        secret = {name: target.pop(name) for name in fields if target.get(name) is not None}
        if key is DESTROYED:
            if cls is _SNAPSHOT:
                if not target.get("erased", False):
                    msg = f"session {stream} is erased but this snapshot's state is not"
                    raise MapperDeserialisationError(msg)
                target.update(secret)  # the erased state holds markers only
                return
            state[SEALED] = ""  # written after erasure: the personal fields are not stored at all
            return
        if not secret:
            return
        nonce = os.urandom(_NONCE_BYTES)
        plain = self.transcoder.encode(secret) if cls is _SNAPSHOT else _plain_json(secret)
        sealed = _cipher(key).encrypt(nonce, plain, _aad(stream, version, topic))
        state[SEALED] = base64.b64encode(nonce + sealed).decode("ascii")

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """The domain event; sealed fields opened with the stream's key, or read as erased.

        A row that does not read back (not JSON, a topic no class has, a seal that does not
        open) is ``StoredEventUnreadable``, naming its stream and version: a row changed in the
        database is bad data, and every reader (history, replay, a command) says which."""
        malformed = _malformed_row(stored_event)
        if malformed is not None:
            raise _unreadable(stored_event, malformed)
        surrogate = _lone_surrogate(stored_event.state)
        if surrogate is not None:
            raise _unreadable(stored_event, surrogate)
        try:
            event = self._domain_event(stored_event)
        except (MapperDeserialisationError, TopicError) as error:
            # The library's message repeats the row; its cause says what is wrong with it.
            reason = error.__cause__ if isinstance(error.__cause__, ValueError) else error
            raise _unreadable(stored_event, str(reason)) from error
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            # A payload that is JSON but no object, or a topic naming a class that is no event:
            # the library's decode meets it as a bare error of its own (exit 70, HTTP 500).
            raise _unreadable(stored_event, f"it does not decode as an event ({error})") from error
        # JSON that decodes but lacks a field (a key renamed or removed in the database) would
        # otherwise fail later, as an AttributeError of whatever reads the event.
        event_class: type[object] = type(event)
        missing = _required_fields(event_class).difference(vars(event))
        if missing:
            raise _unreadable(stored_event, f"its payload lacks {', '.join(sorted(missing))}")
        mistyped = _mistyped_field(event_class, vars(event))
        if mistyped is not None:
            raise _unreadable(stored_event, mistyped)
        return event

    def _domain_event(self, stored_event: StoredEvent) -> Any:
        if not is_sealed(stored_event):
            return super().to_domain_event(stored_event)
        cls = resolve_topic(stored_event.topic)
        try:
            state: dict[str, Any] = self.transcoder.decode(stored_event.state)
        except Exception as e:
            where = f"{stored_event.originator_id} v{stored_event.originator_version}"
            msg = f"cannot decode the stored event {where}: {e}"
            raise MapperDeserialisationError(msg) from e
        sealed = state.pop(SEALED, None)
        if isinstance(sealed, str):
            target = state["state"] if cls is _SNAPSHOT else state
            target.update(self._open(sealed, cls, stored_event, target))
        id_convertor = find_id_convertor(cls, cast("Hashable", type(stored_event.originator_id)))
        state["originator_id"] = id_convertor(stored_event.originator_id)
        state["originator_version"] = stored_event.originator_version
        class_version = getattr(cls, "class_version", 1)
        from_version = state.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        domain_event = object.__new__(cls)
        object.__setattr__(domain_event, "__dict__", state)
        return domain_event

    def _open(
        self, sealed: str, cls: type[Any], stored: StoredEvent, state: dict[str, Any]
    ) -> dict[str, Any]:
        stream = stored.originator_id
        key = self.keys.key_of(stream if isinstance(stream, UUID) else UUID(stream)) if sealed else DESTROYED
        where = f"{stored.topic} of {stored.originator_id} v{stored.originator_version}"
        if key is DESTROYED or key is None:
            if cls is _SNAPSHOT:
                msg = f"the snapshot {where} is sealed under a destroyed key (read the events instead)"
                raise MapperDeserialisationError(msg)
            # Fields still in the clear held None (never sealed): they stay None.
            return {name: erased_value(name) for name in _personal_fields(cls) if name not in state}
        raw = base64.b64decode(sealed)
        try:
            plain = _cipher(key).decrypt(
                raw[:_NONCE_BYTES],
                raw[_NONCE_BYTES:],
                _aad(stored.originator_id, stored.originator_version, stored.topic),
            )
        except InvalidTag as e:
            msg = f"the sealed fields of {where} do not open with its data key (wrong key, or altered)"
            raise MapperDeserialisationError(msg) from e
        opened: dict[str, Any] = self.transcoder.decode(plain) if cls is _SNAPSHOT else json.loads(plain)
        return opened
