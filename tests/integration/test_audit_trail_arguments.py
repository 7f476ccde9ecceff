"""``engine.audit`` (the ``AuditTrail``) and the audit functions over it refuse a value of the
wrong type or out of its range with a one-line ValidationError naming the argument, as
``engine.retention`` does (``test_retention_service_arguments.py``), never a raw Python error.

Observed (an outside probe): ``engine.audit.anchored(5)`` raised ``AttributeError: 'int' object
has no attribute 'exists'`` (a string path too: only a ``Path`` was read), ``checked_bundle(5)``
``TypeError: 'int' object is not iterable`` (and a single string was read one character a
line), ``heads_at(None)`` an AttributeError, ``verify_chain(trail, stream="s1")`` PostgreSQL's
``invalid input syntax for type uuid`` and ``stream=5`` its ``operator does not exist: uuid =
smallint``, ``verify_chain(trail, public_key=5)`` answered as if no key were given, and
``export_bundle(trail, out, 5)`` a TypeError.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from flowledger.domain.errors import AuditError, ValidationError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.bundles import export_bundle
from flowledger.infrastructure.postgres.chain_verify import verify_chain

WRONG = [5, True, 2**80, -1, 1.5, b"x", ["x"], "", "a\x00b"]
"""What is no path (or no path that can be opened): an int, a bool, a float, bytes, a list,
an empty string, a string with NUL."""


def refused_field(call: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        call()
    assert "\n" not in str(refused.value)
    return refused.value.field


@pytest.mark.parametrize("value", WRONG, ids=repr)
def test_an_anchor_file_that_is_no_path_is_refused_naming_it(pg_engine: Engine, value: Any) -> None:
    assert refused_field(lambda: pg_engine.audit.anchored(value)) == "path"
    assert refused_field(lambda: verify_chain(pg_engine.audit, anchors=value)) == "anchors"


def test_an_anchor_file_is_named_by_a_string_too_and_one_that_cannot_be_read_is_refused(
    pg_engine: Engine, tmp_path: Path
) -> None:
    pg_engine.start_session("s1", "wf")
    taken = pg_engine.audit.checkpoint()
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(pg_engine.audit.anchor_file.read_text(encoding="utf-8"), encoding="utf-8")
    assert [r["statement"]["seq"] for r in pg_engine.audit.anchored(str(anchors))] == [taken.seq]
    assert pg_engine.audit.anchored(str(tmp_path / "none.jsonl")) == []
    # A directory is no anchor file: refused, in one line, naming the argument
    assert refused_field(lambda: pg_engine.audit.anchored(tmp_path)) == "path"
    # A file that is not UTF-8 text is a damaged anchor file, as one with a line not JSON is
    (tmp_path / "latin1.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(AuditError, match=r"latin1.jsonl is not UTF-8 text \(byte 0\)"):
        pg_engine.audit.anchored(tmp_path / "latin1.jsonl")


@pytest.mark.parametrize("value", [5, None, True, 1.5, b"x", "line", [5], ["ok", None]], ids=repr)
def test_a_bundle_that_is_no_list_of_lines_is_refused_naming_it(pg_engine: Engine, value: Any) -> None:
    assert refused_field(lambda: pg_engine.audit.checked_bundle(value)) == "lines"


def test_a_bundle_given_as_lines_is_still_checked(pg_engine: Engine) -> None:
    report = pg_engine.audit.checked_bundle(("not a bundle",))
    assert not report.ok


@pytest.mark.parametrize("value", [5, None, "1", {"seq": 1}], ids=repr)
def test_heads_of_what_is_no_checkpoint_are_refused_naming_it(pg_engine: Engine, value: Any) -> None:
    assert refused_field(lambda: pg_engine.audit.heads_at(value)) == "checkpoint"


@pytest.mark.parametrize("value", [5, True, "s1", "a\nb", "", b"x" * 16, [UUID(int=1)]], ids=repr)
def test_a_stream_to_verify_that_is_no_aggregate_id_is_refused_naming_it(
    pg_engine: Engine, value: Any
) -> None:
    pg_engine.start_session("s1", "wf")
    assert refused_field(lambda: verify_chain(pg_engine.audit, stream=value)) == "stream"


@pytest.mark.parametrize("value", [5, True, "ab" * 32, b"short", b"x" * 33, [b"x" * 32]], ids=repr)
def test_a_public_key_that_is_no_32_bytes_is_refused(pg_engine: Engine, value: Any) -> None:
    assert refused_field(lambda: verify_chain(pg_engine.audit, public_key=value)) == "public_key"
    assert refused_field(lambda: pg_engine.audit.trusted_keys(value)) == "current"


@pytest.mark.parametrize("value", [5, True, "s1", b"x", [5], ["s1"]], ids=repr)
def test_streams_to_export_that_are_no_list_of_aggregate_ids_are_refused(
    pg_engine: Engine, value: Any
) -> None:
    pg_engine.start_session("s1", "wf")
    out = io.StringIO()
    assert refused_field(lambda: export_bundle(pg_engine.audit, out, value)) == "streams"
    assert out.getvalue() == ""
    # And the session's own stream exports as before
    summary = export_bundle(pg_engine.audit, out, [pg_engine.session_uuid("s1")])
    assert (summary.streams, summary.events) == (1, 1)


@pytest.mark.parametrize("value", [5, "k" * 32, b"", b"k" * 15, bytearray(32), None], ids=repr)
def test_a_chain_key_that_is_no_key_is_refused_and_the_trail_keeps_its_own(
    pg_engine: Engine, value: Any
) -> None:
    # (Taken as given: a str was a TypeError at the next check, b"" an empty HMAC key.)
    pg_engine.start_session("s1", "wf")
    before = pg_engine.audit.chain_key
    assert refused_field(lambda: pg_engine.audit.use_chain_key(value)) == "key"
    assert pg_engine.audit.chain_key == before
    assert verify_chain(pg_engine.audit).findings == []


def test_the_chain_key_an_engine_seals_with_is_not_replaced_under_it(pg_engine: Engine) -> None:
    # (Another key was taken: the engine went on sealing with the key it started with, and every
    # check through its trail then read its own rows as forged.)
    pg_engine.start_session("s1", "wf")
    before = pg_engine.audit.chain_key
    pg_engine.audit.use_chain_key(before)  # the same key again: nothing changes
    assert refused_field(lambda: pg_engine.audit.use_chain_key(bytes(32))) == "key"
    pg_engine.record_step("s1", "a")
    assert pg_engine.audit.chain_key == before
    assert verify_chain(pg_engine.audit).findings == []


@pytest.mark.parametrize("value", [5, "", None, b"events"], ids=repr)
def test_a_table_that_is_no_name_is_refused(pg_engine: Engine, value: Any) -> None:
    assert refused_field(lambda: pg_engine.audit.table(value)) == "name"
