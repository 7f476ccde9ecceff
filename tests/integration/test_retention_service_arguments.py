"""``engine.retention`` (README: ``engine.retention.set_policy``) takes paths as
``engine.archive_sessions`` does: a string is a path, and what is no path is a ValidationError
naming it, as is a batch size that is no whole number.

Observed (an outside probe): ``engine.retention.archive("/tmp/out", dry_run=True)`` raised
``AttributeError: 'str' object has no attribute 'absolute'`` (only the facade turned strings
into paths), ``archive(5)`` the same for an int, ``archive(path, batch_size="5")`` a
TypeError, and ``restore("/x.jsonl")`` an AttributeError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from flowledger.projections.retention import archive


def test_the_retention_service_takes_a_string_as_a_path(pg_engine: Engine, tmp_path: Path) -> None:
    pg_engine.retention.set_policy("wf", 30)
    report = pg_engine.retention.archive(str(tmp_path / "out"), dry_run=True)
    assert report.dry_run
    with pytest.raises(ValidationError, match="bundle: cannot read"):
        pg_engine.retention.restore(str(tmp_path / "none.jsonl"))


@pytest.mark.parametrize("value", [5, None, "", "a\x00b", ["x"], 1.5], ids=repr)
def test_what_is_no_path_is_refused_naming_it(pg_engine: Engine, value: Any) -> None:
    with pytest.raises(ValidationError) as archive_refused:
        pg_engine.retention.archive(value, dry_run=True)
    with pytest.raises(ValidationError) as restore_refused:
        pg_engine.retention.restore(value)
    assert (archive_refused.value.field, restore_refused.value.field) == ("out_dir", "bundle")


@pytest.mark.parametrize("size", ["5", 1.5, True, 0, None], ids=repr)
def test_a_batch_size_that_is_no_whole_number_from_one_is_refused(
    pg_engine: Engine, tmp_path: Path, size: Any
) -> None:
    with pytest.raises(ValidationError) as refused:
        pg_engine.retention.archive(tmp_path, dry_run=True, batch_size=size)
    assert refused.value.field == "batch_size"


@pytest.mark.parametrize("flag", [None, 0, 1, "no", "yes", [], 1.0], ids=repr)
def test_a_dry_run_that_is_no_true_or_false_is_refused_before_anything_is_read(
    pg_engine: Engine, tmp_path: Path, flag: Any
) -> None:
    # dry_run=None or 0 had archived for real (rows deleted), dry_run="no" had counted only
    pg_engine.retention.set_policy("wf", 30)
    with pytest.raises(ValidationError) as refused:
        pg_engine.retention.archive(tmp_path / "out", dry_run=flag)
    with pytest.raises(ValidationError) as refused_by_the_engine:
        pg_engine.archive_sessions(tmp_path / "out", dry_run=flag)
    with pytest.raises(ValidationError) as refused_by_the_projections:
        archive(pg_engine, projector_for(pg_engine), tmp_path / "out", dry_run=flag)
    fields = {refused.value.field, refused_by_the_engine.value.field, refused_by_the_projections.value.field}
    assert fields == {"dry_run"}
    assert "must be true or false" in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sessions", ["s-1", b"s-1", 5, True, {"s-1": 1}], ids=repr)
def test_sessions_to_restore_that_are_no_list_of_ids_are_refused_before_the_bundle_is_read(
    pg_engine: Engine, tmp_path: Path, sessions: Any
) -> None:
    # The service read "s-1" as the sessions 's', '-' and '1' (as the engine's own method did
    # not); it is refused as the engine refuses it, before the bundle is opened
    with pytest.raises(ValidationError) as refused:
        pg_engine.retention.restore(tmp_path / "none.jsonl", sessions)
    assert refused.value.field == "sessions"


@pytest.mark.parametrize("needles", [5, None, "u", b"u", ["u"], [5], [b""], [b"u", None]], ids=repr)
def test_needles_that_are_no_list_of_non_empty_bytes_are_refused(pg_engine: Engine, needles: Any) -> None:
    # archived_naming("u") had named every archived session whose snapshot holds the letter u
    # (a string read as its characters), [b""] every archived session, and [5] or b"x" reached
    # PostgreSQL ("cannot cast type smallint[] to bytea[]")
    with pytest.raises(ValidationError) as refused:
        pg_engine.retention.archived_naming(needles)
    assert refused.value.field == "needles"


@pytest.mark.parametrize("sessions", [[], ()], ids=repr)
def test_an_empty_list_of_sessions_to_restore_is_refused_saying_what_restores_them_all(
    pg_engine: Engine, tmp_path: Path, sessions: Any
) -> None:
    # restore(bundle, []) read and checked the whole bundle and then said "session: none of []
    # is archived in …", as if the bundle were at fault
    for restore in (pg_engine.retention.restore, pg_engine.restore_sessions):
        with pytest.raises(ValidationError, match=r"names no session: .*None restores") as refused:
            restore(tmp_path / "none.jsonl", sessions)
        assert refused.value.field == "sessions"


@pytest.mark.parametrize("hook", ["projection_rows", "before_commit"])
@pytest.mark.parametrize("value", [5, "rows", {}], ids=repr)
def test_an_archive_hook_that_is_no_function_is_refused_before_anything_is_read(
    pg_engine: Engine, tmp_path: Path, hook: str, value: Any
) -> None:
    # projection_rows=5 had raised "TypeError: 'int' object is not callable" from inside the run
    pg_engine.retention.set_policy("wf", 30)
    for archive_sessions in (pg_engine.retention.archive, pg_engine.archive_sessions):
        with pytest.raises(ValidationError) as refused:
            archive_sessions(tmp_path / "out", **{hook: value})
        assert refused.value.field == hook
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [5, "insert", {}], ids=repr)
def test_a_restore_hook_that_is_no_function_is_refused_before_the_bundle_is_read(
    pg_engine: Engine, tmp_path: Path, value: Any
) -> None:
    for restore in (pg_engine.retention.restore, pg_engine.restore_sessions):
        with pytest.raises(ValidationError) as refused:
            restore(tmp_path / "none.jsonl", before_insert=value)
        assert refused.value.field == "before_insert"
