"""Bounds on every input a command takes: text PostgreSQL and UTF-8 can hold, lengths, JSON
depth and size, durations and counts. Each refusal is a ``ValidationError`` naming the field.

Why each rule exists:

- NUL (U+0000) cannot be stored in a PostgreSQL ``text`` column nor in ``jsonb`` (as
  ``\\u0000``); one NUL accepted into the log once broke every projection that copies it.
- A lone surrogate (U+D800..U+DFFF) is not a character: UTF-8 cannot encode it, so it fails
  on the way to the database (``UnicodeEncodeError``), and ``jsonb`` refuses its escape.
- Ids and names also refuse control characters (U+0000..U+001F, U+007F..U+009F): the
  aggregate id is ``uuid5(tenant + U+001F + id)``, and ids end up in logs and terminals.
- Session, task and agent ids also refuse ``/``: REST (and whoever links to it) addresses
  them in URL paths, and servers decode ``%2F`` before routing, so ``ops/1`` could be created
  but never read, completed or released again (an agent's slot held for good). Checked only
  when the session, task or agent is created: ids stored before the rule still load and work.
- Deeply nested JSON exhausts the recursion of every encoder and decoder on the way, and a
  large payload is stored twice (``StepStarted`` and ``StepProcessed``).
- A duration beyond what ``datetime`` can add raises ``OverflowError`` far from the input.

The limits (``MAX_*``) are documented in ``docs/projections.md`` ("Bounded input").
"""

from __future__ import annotations

import json
import math
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar, cast
from uuid import UUID, uuid5

from flowledger.domain.errors import ValidationError

MAX_NAME_LENGTH = 200
"""Ids (session, task, agent, idempotency key, tenant) and names (workflow, step, model, user)."""
MAX_TEXT_LENGTH = 10_000
"""Free text a caller writes: a task's description."""
MAX_JSON_DEPTH = 32
"""Nesting of objects and arrays in a JSON payload; ``{"a": [1]}`` has depth 2."""
MAX_JSON_BYTES = 1_048_576
"""A JSON payload's size as stored: compact JSON text in UTF-8, 1 MiB (the HTTP body limit)."""
MAX_TTL = timedelta(days=366)
"""A session's TTL, and how far one extension reaches."""
MAX_DEADLINE = timedelta(days=3660)
"""How far ahead a task's deadline may lie (about ten years)."""
MIN_DEADLINE_DELAY = timedelta(hours=0.001)
"""How soon a deadline given as a delay may lie (3.6 s): REST's least ``deadline_hours``, the
library's and the CLI's too (``--deadline-hours 0.0001`` made a task due in 0.36 s where REST
refused it). A moment is not bounded so: one in the past is taken (the task is escalated)."""
MIN_DERIVED_DEADLINE = timedelta(hours=1)
"""How soon a deadline derived from a classification's estimate may lie at the soonest: the
seed's smallest ``deadline_hours``. A tiny estimate (1e-9 hours) derived one at the moment of
classification, and the next assignment escalated the task with a free agent waiting."""
MAX_SKILLS = 100
"""Skills an agent has or a task requires."""
MAX_REASON_LENGTH = 2_000
"""A reason a caller gives: abandoning a session, releasing or requeueing a task, erasing data."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_CHARACTERS = _UNSTORABLE
"""What PostgreSQL cannot store in text: NUL, and lone surrogates (not UTF-8)."""
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
NAME_IGNORABLE_CLASS = (
    r"\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
)
"""The characters drawn as nothing that a name may not be made of alone (``require_name``), as
the body of a regular expression's character class: Unicode's Default_Ignorable_Code_Point
characters of the Basic Multilingual Plane (zero-width space and joiners, the byte-order mark,
soft hyphen, bidi controls, variation selectors). The HTTP schema's patterns name these, as a
JSON schema's pattern (ECMA-262 without the ``u`` flag, as Swagger UI runs it) can name no
character past U+FFFF in a class; the domain's check (``require_name``) also refuses a name of
only the few past it (``IGNORABLE_CLASS``: tag characters), which the schema passes on to it."""
IGNORABLE_CLASS = NAME_IGNORABLE_CLASS + r"\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
"""Every Default_Ignorable_Code_Point character (DerivedCoreProperties.txt), as a class body:
Unicode's NFKC_Casefold drops them, and so does ``agent.fold_text``."""
_IGNORABLE = re.compile(f"[{IGNORABLE_CLASS}]")
_SPACE_BUT_ONE_PLAIN = re.compile(r"[^\S ]|  ")
"""White space inside an id that a reader cannot tell from one plain space: any other (a no-break,
an em or an ideographic space, a line separator) and two plain spaces in a row. ``look 1``,
``look\u00a01`` and ``look\u20031`` were three sessions, each listed as ``look 1``."""
_SCALARS = (str, int, float, bool, type(None))
_LARGEST_PLAIN_INT_BITS = 10_000
"""Larger ints take the encoder's path (it refuses past 4,300 digits, about 14,000 bits)."""
_FINITE_MAX = sys.float_info.max
_FINITE_MIN = -_FINITE_MAX
_COMPACT_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
"""Built once: ``json.dumps`` with any option builds a new encoder on every call."""


def _compact_chunks() -> Callable[[Any, int], Iterable[str]]:
    """``_COMPACT_JSON``'s C encoder, built once: ``JSONEncoder.encode`` builds it (and a float
    formatter) again on every call, half of what a step's ``json_bytes`` took (6.0 µs, 2.8 µs
    with the encoder built once: ``timeit``). The same text; without the encoder's check for a
    value that holds itself, which ``require_json``'s depth bound refuses before any value is
    measured (one would end in a RecursionError here, not a ValueError)."""
    try:
        from _json import make_encoder
    except ImportError:  # pragma: no cover - an interpreter without the C accelerator
        return lambda value, _: (_COMPACT_JSON.encode(value),)
    return make_encoder(
        None, _COMPACT_JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )


_COMPACT_CHUNKS = _compact_chunks()


def versions_held(count: int) -> str:
    """``count`` versions in words a refusal can show: "1 version", "3 versions"."""
    return f"{count} version" if count == 1 else f"{count} versions"


def shown(value: Any) -> str:
    """``repr(value)`` for a refusal's message, or what the value is when Python cannot write it
    out: an int past 4,300 digits (``sys.get_int_max_str_digits``) by its size, a container
    holding one, or nested deeper than ``repr`` follows. Their ``repr`` raises (ValueError,
    RecursionError), which reached the caller of ``get_session(version=10**5000)`` or
    ``start_session(ttl=<a dict nested 2,000 deep>)`` instead of the refusal. Every message that
    quotes a value a caller gave writes it with ``shown``, never ``!r``."""
    if type(value) is int and value.bit_length() > _LARGEST_PLAIN_INT_BITS and _too_long(value):
        return f"an integer of {int(math.log10(abs(value))) + 1:,} digits"
    try:
        return repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply to show"
    except ValueError as error:
        if "integer string conversion" not in str(error):
            return f"a {type(value).__name__} that cannot be shown ({type(error).__name__})"
        limit = sys.get_int_max_str_digits()
        return f"a {type(value).__name__} holding an integer of more than {limit:,} digits"
    except Exception as error:  # a __repr__ of the caller's own that raises
        return f"a {type(value).__name__} that cannot be shown ({type(error).__name__})"


_SHOWN_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
"""Every C0 control but the line break, DEL and every C1 control (U+009B is a terminal's CSI)."""
_SHOWN_CONTROLS_AND_BIDI = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""The same, and the bidi embeddings, overrides and isolates (they reorder what follows them)."""
_SPELLED = {"\t": "\\t", "\r": "\\r"}


def _spelled(found: re.Match[str]) -> str:
    char = found.group()
    return _SPELLED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def spell_controls(text: str, *, bidi: bool = False) -> str:
    """``text`` with each control character (and with ``bidi`` each bidi embedding, override
    and isolate) written as its escape, as Python writes one (``\\x1b``, ``\\u202e``); the
    line break stays one. For names shown as recorded (a model or provider a call reported may
    hold any character): a terminal acts on ESC, a page draws it as nothing."""
    if text.isprintable():
        return text
    pattern = _SHOWN_CONTROLS_AND_BIDI if bidi else _SHOWN_CONTROLS
    return text if pattern.search(text) is None else pattern.sub(_spelled, text)


def json_problem(error: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused a text, in words for whoever wrote it: nested deeper than the
    reader follows (its ``RecursionError``, which ended a CLI command as "a bug in flowledger",
    exit 70), a number too long to read (without Python's advice to raise
    ``sys.set_int_max_str_digits()``, which is for the interpreter's owner), else its own words."""
    if isinstance(error, RecursionError):
        return "is nested too deeply to read"
    if "integer string conversion" in str(error):
        return f"holds a number of more than {sys.get_int_max_str_digits():,} digits"
    return str(error)


def _why(char: str) -> str:
    if char == "\x00":
        return "must not contain NUL characters (U+0000): PostgreSQL text cannot store them"
    if "\ud800" <= char <= "\udfff":
        return (
            f"must not contain a lone surrogate (U+{ord(char):04X}): it is not a character"
            " and UTF-8 cannot encode it"
        )
    return f"must not contain control characters (found U+{ord(char):04X})"


def _storable(text: str) -> bool:
    """No NUL and no lone surrogate in ``text``: for ASCII (checked in constant time), a NUL scan."""
    if text.isascii():
        return "\x00" not in text
    return _UNSTORABLE.search(text) is None


def plainly_text(value: Any, max_length: int) -> bool:
    """What ``require_text`` accepts, as a bool and without a field name (for fast paths)."""
    return type(value) is str and len(value) <= max_length and bool(value.strip()) and _storable(value)


def require_text(
    field_name: str, value: Any, *, max_length: int = MAX_TEXT_LENGTH, visible: bool = False
) -> str:
    """Raise ValidationError unless ``value`` is a non-blank string PostgreSQL can store, at most
    ``max_length`` characters long (NUL and lone surrogates refused); with ``visible`` (what a
    command is given, never what a read decodes), holding a character that is drawn, too."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field_name, "must be a non-empty string")
    if visible and not _drawn(value).strip():
        # (An outside probe: a task of one zero-width space was created, where "   " is refused.)
        raise ValidationError(
            field_name, "must hold a visible character, not only ones drawn as nothing (a zero-width space)"
        )
    if len(value) > max_length:
        raise ValidationError(field_name, f"must be at most {max_length} characters, got {len(value)}")
    found = _UNSTORABLE.search(value)
    if found:
        raise ValidationError(field_name, _why(found.group()))
    return value


def require_resolution(value: Any) -> dict[str, Any]:
    """A resolution as an object: a JSON object as it is, a string as ``{"resolution": s}``.

    A string is free text and follows ``require_text`` (not blank, no NUL or lone surrogate, at
    most ``MAX_TEXT_LENGTH``), as a reason does: ``""`` resolves nothing. ``{}`` is an object.
    """
    if isinstance(value, str):
        return {"resolution": require_text("resolution", value)}
    if not isinstance(value, dict):
        raise ValidationError("resolution", "must be a string or a JSON object")
    require_json("resolution", value)
    return value


def require_name(field_name: str, value: Any) -> str:
    """Raise ValidationError unless ``value`` is a non-blank string of at most 200 characters
    with no control characters (and so no NUL) and no lone surrogates, holding a character
    that is drawn (not only ``IGNORABLE_CLASS``'s)."""
    name = _require_storable_name(field_name, value)
    if not _drawn(name).strip():
        # (An outside probe: a session id of one zero-width space was taken, and shown as nothing.)
        raise ValidationError(
            field_name, "must hold a visible character, not only ones drawn as nothing (a zero-width space)"
        )
    return name


def _require_storable_name(field_name: str, value: Any) -> str:
    """``require_name`` but for the visible character: the rule an id is looked up by, so that
    one stored before that rule (only characters drawn as nothing) can still be read."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field_name, "must be a non-empty string")
    if len(value) > MAX_NAME_LENGTH:
        raise ValidationError(field_name, f"must be at most {MAX_NAME_LENGTH} characters, got {len(value)}")
    if value.isascii() and value.isprintable():  # the usual name: no control character at all
        return value
    found = _NOT_IN_NAMES.search(value)
    if found:
        raise ValidationError(field_name, _why(found.group()))
    return value


def require_no_controls(field_name: str, value: str) -> str:
    """Raise ValidationError if ``value`` holds a control character (``require_name``'s rule
    without its length, for ids up to 1,000 characters a caller gives: a response id)."""
    found = None if value.isascii() and value.isprintable() else _NOT_IN_NAMES.search(value)
    if found:
        raise ValidationError(field_name, _why(found.group()))
    return value


def _drawn(name: str) -> str:
    """``name`` without the characters drawn as nothing (``IGNORABLE_CLASS``, the astral ones
    included; an ASCII name has none: as it is)."""
    return name if name.isascii() else _IGNORABLE.sub("", name)


def without_ignorables(text: str) -> str:
    """``text`` without the characters Unicode draws as nothing (``IGNORABLE_CLASS``)."""
    return _IGNORABLE.sub("", text)


def require_model(value: Any) -> str:
    """Raise ValidationError (field ``model``) unless ``value`` is a name (``require_name``) with
    no space around it. The price table reads a name with its spaces trimmed (``model_names``),
    so " deepseek-v3.2" passed the check for an unknown model, while the provider was asked
    for the name as written and the call recorded under it (a row of its own on the cost
    dashboard); a provider would answer that it has no such model."""
    require_name("model", value)
    if value != value.strip():
        raise ValidationError(
            "model",
            f"must have no space around it, got {value!r} (the provider is asked for the name as written)",
        )
    return str(value)


def require_tenant(value: Any) -> str:
    """Raise ValidationError (field ``tenant``) unless ``value`` is a tenant's name: the one rule
    for a tenant wherever it is given, an engine's (``Settings.tenant``, ``FLOWLEDGER_TENANT``,
    ``--tenant``) and an API key's (``flowledger keys create``, ``FLOWLEDGER_API_KEYS``).

    It is a name (``require_name``: not blank, at most 200 characters, no control characters),
    so ``acme corp`` is one. Keys once took only letters, digits, '.', '_' and '-' (at most
    100): a tenant the engine accepted and stored data for could then have no key, and the
    HTTP API could never reach its data. A key's rule was widened rather than the engine's
    narrowed: a narrower rule would lock data already written under a wider name out. Nothing
    breaks for a wider key name: the tenant is never part of a URL, header or SQL name (its
    views' schema is a hash of it); only ``FLOWLEDGER_API_KEYS`` cannot spell ':' or ',' in
    one (its separators): such a tenant's key is made with ``flowledger keys create``.
    The domain's checks of a tenant (``scoped_uuid``, a new session, task, agent or budget)
    apply this same rule (``require_tenant``).

    Not held to a name's visible character: a tenant names data already stored under it. A
    *new* tenant's name is held to more (``tenant_names.require_new_tenant``).
    """
    return _require_storable_name("tenant", value)


def require_id(field_name: str, value: Any, *, unlike_others: bool = True) -> str:
    """Raise ValidationError unless ``value`` is a name (``require_name``) holding no ``/`` and
    not only dots: the id of a new session, task or agent, which URL paths address (clients
    resolve ``.`` and ``..`` segments away: ``/v1/tasks/.`` is the task list); and that looks
    like no other id (``_require_unlike_others``), unless ``unlike_others`` is False (a budget's
    subject, which may name a session stored before that rule). Only a new id is held to it:
    one stored before is looked up as it was written (``scoped_uuid``)."""
    name = require_name(field_name, value)
    if "/" in name:
        raise ValidationError(field_name, "must not contain '/': URL paths address the id and would split it")
    if not _drawn(name).replace(".", "").strip():
        raise ValidationError(
            field_name, "must not be only dots: URL paths address the id ('.' and '..' vanish)"
        )
    if unlike_others and (not name.isascii() or name[0].isspace() or name[-1].isspace() or "  " in name):
        _require_unlike_others(field_name, name)
    return name


def _require_unlike_others(field_name: str, name: str) -> None:
    """Refuse an id that is shown as another id is, yet is another: white space around it, a
    character drawn as nothing anywhere in it (``IGNORABLE_CLASS``: a zero-width space, a word
    joiner, a byte-order mark, a soft hyphen), or letters not in Unicode's composed form (NFC:
    ``cafe`` and U+0301 is shown as ``café``, which is another string), white space inside it
    but single plain spaces (``_SPACE_BUT_ONE_PLAIN``). Each was taken, and
    ``look-1`` and ``look-1 `` were two sessions a reader could not tell apart."""
    if name != name.strip():
        raise ValidationError(
            field_name, f"must not have white space around it: it would look like another id (got {name!r})"
        )
    spaced = _SPACE_BUT_ONE_PLAIN.search(name)
    if spaced is not None:
        found_text = "two spaces in a row" if spaced.group() == "  " else f"U+{ord(spaced.group()):04X}"
        raise ValidationError(
            field_name,
            f"must not hold white space other than single plain spaces (found {found_text}): it would"
            f" look like another id (got {name!r})",
        )
    found = _IGNORABLE.search(name)
    if found is not None:
        raise ValidationError(
            field_name,
            f"must not contain characters drawn as nothing (found U+{ord(found.group()):04X}): it would"
            f" look like another id (got {name!r})",
        )
    if not unicodedata.is_normalized("NFC", name):
        composed = unicodedata.normalize("NFC", name)
        raise ValidationError(
            field_name,
            f"must be in Unicode's composed form (NFC): it would look like {composed!r}, another id"
            f" (got {name!a}: shown alike, its combining marks written out)",
        )


def scoped_uuid(namespace: UUID, field_name: str, tenant: str, name: str) -> UUID:
    """The aggregate id of a caller's id: ``uuid5(tenant + U+001F + name)`` in ``namespace``
    (ValidationError naming ``tenant`` or ``field_name`` unless both are names).

    Remembered (every command and read starts here, and an assignment asks for the same few
    ids many times over); anything that is not a string goes to the checks uncached, so it
    is refused with the field's name rather than a TypeError from the cache.
    """
    # Keyed by the namespace's int: a UUID's own hash runs in Python, on every call.
    if type(tenant) is str and type(name) is str:
        return _scoped_uuid(namespace.int, field_name, tenant, name)
    return _scoped_uuid.__wrapped__(namespace.int, field_name, tenant, name)


@lru_cache(maxsize=65_536)
def _scoped_uuid(namespace: int, field_name: str, tenant: str, name: str) -> UUID:
    # Looked up, so ids stored before names needed a visible character are still found.
    _require_storable_name("tenant", tenant)
    _require_storable_name(field_name, name)
    return uuid5(UUID(int=namespace), f"{tenant}\x1f{name}")


def storable(text: str, max_length: int) -> str:
    """``text`` cut to ``max_length`` with NUL and lone surrogates replaced by U+FFFD.

    For text the system writes itself (error messages, escalation details), which is kept
    rather than refused: a failure must be recorded even when its message is odd.
    """
    return _UNSTORABLE.sub("\ufffd", text[:max_length])


def storable_name(value: object, fallback: str) -> str:
    """``value`` as a name ``require_name`` takes: cut to ``MAX_NAME_LENGTH``, each character a
    name may not hold replaced by U+FFFD, ``fallback`` when nothing visible is left. For names
    the system records from elsewhere (a failure's error type from an LLM adapter), which are
    kept rather than refused: a failure must be recorded whatever its adapter called it."""
    text = _NOT_IN_NAMES.sub("\ufffd", str(value)[:MAX_NAME_LENGTH]) if isinstance(value, str) else ""
    return text if _drawn(text).strip() else fallback


def require_json(field_name: str, value: Any) -> None:
    """Raise ValidationError unless ``value`` is plain JSON that PostgreSQL's ``jsonb`` can hold.

    Objects (dicts with string keys), arrays (lists, tuples), strings, finite numbers,
    booleans and null; nested at most ``MAX_JSON_DEPTH`` deep; at most ``MAX_JSON_BYTES``
    as JSON text; no NUL or lone surrogate in any key or string. Non-string keys are
    refused: JSON would turn them into strings, and the state rebuilt from the stored
    event would then differ from the live one. The walk runs before any encoding, so a
    too-deep value is refused before an encoder's recursion gives out.
    """
    bound = _plain_json_bound(value)
    if bound < 0:
        _explain_json(field_name, value)  # raises, naming where (the encoder judges the rest)
    if bound < 0 or bound > MAX_JSON_BYTES:  # only then is the exact size worth an encoding
        size = _json_size(field_name, value)
        if size > MAX_JSON_BYTES:
            raise ValidationError(field_name, f"is {size:,} bytes as JSON; the limit is {MAX_JSON_BYTES:,}")


J = TypeVar("J")


def plain_json(value: J) -> J:
    """``value`` as its stored event reads back: tuples as lists, subclasses of ``str``,
    ``int``, ``float`` and ``dict`` (an enum of strings, an ``OrderedDict``) as the plain types;
    ``value`` itself when it holds none (the usual case: one walk, no copy). For JSON that
    ``require_json`` accepted.

    A command keeps what it was given in its event until the event is stored and read back:
    ``record_step`` with ``input={"tags": ("a", "b")}`` answered with the tuple, and a retry
    under the same key, answered from the log, with a list, so the two answers to one request
    differed (``(1, 2) != [1, 2]``)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return cast(J, json.loads(_COMPACT_JSON.encode(value)))
                stack.append(child)
        elif kind is list:
            stack.extend(item)
        elif not (kind is str or kind is int or kind is float or kind is bool or item is None):
            return cast(J, json.loads(_COMPACT_JSON.encode(value)))
    return value


def _plain_json_bound(value: Any) -> int:
    """The walk of ``require_json`` without a path per node or an encoding (every step's input
    and output pass through here): an upper bound of the value's compact JSON size in bytes,
    or -1 when something needs the careful walk (``_explain_json``) or the encoder's verdict
    (non-finite floats, huge ints, subclasses).

    A string's characters encode to at most 12 bytes each (an astral character as two
    ``\\uXXXX`` escapes), an int of ``b`` bits to at most ``b // 3 + 3`` characters, a float
    to at most 32; each container adds its brackets and separators.
    """
    bound = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            if not _storable(item):
                return -1
            bound += 12 * len(item) + 3  # quotes and the separator after it
        elif kind is dict:
            if depth > MAX_JSON_DEPTH:
                return -1
            bound += 2 + len(item)
            for key, child in item.items():
                if type(key) is not str or not _storable(key):
                    return -1
                bound += 12 * len(key) + 3  # quotes and the colon
                stack.append((child, depth + 1))
        elif kind is list or kind is tuple:
            if depth > MAX_JSON_DEPTH:
                return -1
            bound += 2 + len(item)
            stack.extend((child, depth + 1) for child in item)
        elif kind is int:
            bits = item.bit_length()
            if bits > _LARGEST_PLAIN_INT_BITS:
                return -1
            bound += bits // 3 + 3
        elif kind is float:
            if not _FINITE_MIN <= item <= _FINITE_MAX:  # NaN fails both comparisons
                return -1
            bound += 32
        elif item is None or kind is bool:
            bound += 6
        else:
            return -1
    return bound


def _explain_json(field_name: str, value: Any) -> None:
    """Walk ``value`` again, tracking paths, and raise the ValidationError that names the fault."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        at = f" (at {path[1:] if path.startswith('.') else path})" if path else ""
        if isinstance(item, dict | list | tuple):
            if depth > MAX_JSON_DEPTH:
                raise ValidationError(field_name, f"is nested more than {MAX_JSON_DEPTH} levels deep{at}")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        message = f"object keys must be strings, got {shown(key)}{at}"
                        raise ValidationError(field_name, message)
                    found = _UNSTORABLE.search(key)
                    if found:
                        raise ValidationError(field_name, f"key {key[:40]!r}{at} {_why(found.group())}")
                    stack.append((child, depth + 1, f"{path}.{key[:40]}"))
            else:
                stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str):
            found = _UNSTORABLE.search(item)
            if found:
                raise ValidationError(
                    field_name, f"{_why(found.group())}{at}".replace("must", "strings must", 1)
                )
        elif not isinstance(item, _SCALARS):
            raise ValidationError(
                field_name, f"must be JSON (object, array, string, number, bool, null), got {shown(item)}{at}"
            )
        elif isinstance(item, float) and not _FINITE_MIN <= item <= _FINITE_MAX:  # NaN fails both
            # Named here, with its path: the encoder's words were "Out of range float values
            # are not JSON compliant", with no place.
            raise ValidationError(
                field_name, f"numbers must be finite (JSON has no NaN or Infinity), got {shown(item)}{at}"
            )
        elif isinstance(item, int) and item.bit_length() > _LARGEST_PLAIN_INT_BITS and _too_long(item):
            limit = sys.get_int_max_str_digits()
            raise ValidationError(field_name, f"holds an integer of more than {limit:,} digits{at}")


def require_object(field_name: str, value: Any, *, optional: bool = False) -> None:
    """Raise ValidationError unless ``value`` is a JSON object (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, dict):
        raise ValidationError(field_name, "must be a JSON object")
    require_json(field_name, value)


def require_duration(field_name: str, value: Any, *, maximum: timedelta) -> timedelta:
    """Raise ValidationError unless ``value`` is a timedelta in (0, ``maximum``]."""
    if not isinstance(value, timedelta) or value <= timedelta(0):
        given = str(value) if isinstance(value, timedelta) else shown(value)  # 0:00:00, -1 day, 23:00:00
        raise ValidationError(field_name, f"must be a positive duration, got {given}")
    if value > maximum:
        raise ValidationError(field_name, f"must be at most {_days(maximum)}, got {_days(value)}")
    return value


def duration_of(field_name: str, amount: Any, unit: timedelta, *, maximum: timedelta) -> timedelta:
    """``amount`` units (e.g. hours from an HTTP field) as a bounded timedelta, or ValidationError.

    Checked before the timedelta is built: ``timedelta(hours=1e20)`` itself overflows.
    """
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount != amount:
        raise ValidationError(field_name, f"must be a number, got {shown(amount)}")
    largest = maximum / unit
    if not 0 < amount <= largest:
        raise ValidationError(field_name, f"must be more than 0 and at most {largest:g}, got {shown(amount)}")
    return require_duration(field_name, unit * amount, maximum=maximum)


def require_ttl(ttl: Any) -> timedelta:
    """Raise ValidationError unless ``ttl`` is a positive timedelta of at most ``MAX_TTL``."""
    return require_duration("ttl", ttl, maximum=MAX_TTL)


def require_flag(field_name: str, value: Any) -> bool:
    """Raise ValidationError unless ``value`` is True or False (a string "no" is not false)."""
    if not isinstance(value, bool):
        raise ValidationError(field_name, f"must be true or false, got {shown(value)}")
    return value


def require_moment(field_name: str, value: Any, *, optional: bool = False) -> None:
    """Raise ValidationError unless ``value`` is a timezone-aware datetime (or None when
    ``optional``) that lies in year 1 or later in UTC too: year 1 at +14:00 can be year 0 there,
    which PostgreSQL stores as BC and its Python driver cannot read back ("timestamp too small"). The
    other end is each field's bound to say (a deadline's ``MAX_DEADLINE``)."""
    if value is None and optional:
        return
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        if isinstance(value, datetime):  # said as it was written, not as Python's repr
            raise ValidationError(
                field_name, f"must carry a time zone (like +00:00 or Z), got {value.isoformat()}"
            )
        raise ValidationError(field_name, f"must be a timezone-aware datetime, got {shown(value)}")
    offset = value.utcoffset()
    if offset is not None and value.replace(tzinfo=None) - datetime.min < offset:
        raise ValidationError(field_name, f"must lie in year 1 or later in UTC, got {value.isoformat()}")


def require_deadline(field_name: str, value: Any, now: datetime) -> datetime | None:
    """A deadline given as an aware moment or as a delay from ``now``, as a moment at most
    ``MAX_DEADLINE`` after ``now`` (ValidationError otherwise; None stays None). One bound for
    both forms: a moment in year 9999 was taken while a delay of eleven years was refused. A
    moment may lie in the past (whoever offers the task then escalates it)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        delay = require_duration(field_name, value, maximum=MAX_DEADLINE)
        if delay < MIN_DEADLINE_DELAY:
            raise ValidationError(field_name, f"{too_soon(MIN_DEADLINE_DELAY)} ahead, got {delay}")
        return now + delay
    require_moment(field_name, value)
    deadline: datetime = value
    if deadline - now > MAX_DEADLINE:
        raise ValidationError(
            field_name,
            f"must be at most {_days(MAX_DEADLINE)} after now ({now.isoformat()}),"
            f" got {deadline.isoformat()}",
        )
    return deadline


def too_soon(least: timedelta) -> str:
    """What a delay below ``least`` is told, in seconds and hours (a deadline's is
    ``must be at least 3.6 s (0.001 hours)``; a session TTL's ``1 ms``)."""
    seconds = least.total_seconds()
    said = f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"
    return f"must be at least {said} ({seconds / 3600:.3g} hours)"


def require_count(field_name: str, value: Any, *, least: int = 0, most: int) -> int:
    """Raise ValidationError unless ``value`` is an int (not a bool) in [``least``, ``most``]."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValidationError(
            field_name, f"must be a whole number from {least} to {most}, got {shown(value)}"
        )
    return value


def require_version(field_name: str, value: Any, *, optional: bool = False) -> int | None:
    """Raise ValidationError unless ``value`` is a version: an int (not a bool) of at least 1
    (or None when ``optional``). ``"3"`` or ``1.5`` is no version, not one out of range."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(field_name, f"must be a version >= 1, got {shown(value)}")
    return value


def _too_long(number: int) -> bool:
    """Whether ``number`` has more digits than Python will write (its ``str`` raises)."""
    try:
        str(number)
    except ValueError:
        return True
    return False


def _json_size(field_name: str, value: Any) -> int:
    try:
        # UTF-8, as the event is stored ("surrogatepass": a lone surrogate is refused elsewhere,
        # with its path; here it only has to be counted).
        return len(_COMPACT_JSON.encode(value).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError) as error:  # NaN and infinity; huge ints (str conversion limit)
        if "integer string conversion" in str(error):
            # Python's own words end "use sys.set_int_max_str_digits() to increase the limit":
            # advice for the interpreter's owner, not for a caller whose value is refused.
            limit = sys.get_int_max_str_digits()
            raise ValidationError(field_name, f"holds an integer of more than {limit:,} digits") from None
        raise ValidationError(field_name, f"must be JSON-serialisable: {error}") from None


def json_bytes(value: Any) -> int:
    """The bytes of ``value`` (JSON that ``require_json`` accepted) as compact JSON in UTF-8.

    The same for a value as a caller gave it and as its stored event or a snapshot reads it
    back, so that a fold gives the same figure on every replay: the standard encoder writes a
    float as its ``repr`` and an int in full, which read back to the same value and so to the
    same text. The domain keeps to the standard library (DESIGN.md); the encoder is built once
    (``_COMPACT_CHUNKS``).
    """
    text = "".join(_COMPACT_CHUNKS(value, 0))
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def names_json_bytes(values: tuple[str | None, ...]) -> int:
    """``json_bytes(values)`` for a tuple of names (strings or None), without the encoder when
    every string is printable ASCII needing no escape (each is then its length plus two
    quotes): a usage's names are measured on every step (``session_views.usage_window_bytes``)."""
    total = 1 + len(values)  # the brackets and the commas between the items
    for value in values:
        if value is None:
            total += 4
        elif value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            total += len(value) + 2
        else:
            return json_bytes(values)
    return total if values else 2


def _days(value: timedelta) -> str:
    """A duration as "3660 days", or with the rest of a day ("3660 days, 1:00:00"): the bound
    and a delay an hour past it read the same when the hours were dropped."""
    whole = value >= timedelta(days=2) and value == timedelta(days=value.days)
    return f"{value.days} days" if whole else str(value)
