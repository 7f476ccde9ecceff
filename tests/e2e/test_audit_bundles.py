"""Bundles checked offline by ``python -m flowledger.verify`` (a subprocess, no database): an exported
session verifies; an edit, even re-chained, or a bundle re-signed with another key, does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.verify import event_hash, head_leaf, merkle_levels, merkle_proof, signed_message
from tests.conftest import make_settings
from tests.support.cli import run_cli


def verify(bundle: Path, public_key: str) -> subprocess.CompletedProcess[str]:
    """The standalone verifier, as an auditor runs it."""
    return subprocess.run(
        [sys.executable, "-m", "flowledger.verify", str(bundle), "--public-key", public_key],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def read(bundle: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in bundle.read_text().splitlines()]


def write(bundle: Path, records: list[dict[str, Any]]) -> None:
    bundle.write_text("".join(json.dumps(r) + "\n" for r in records))


def rechain(records: list[dict[str, Any]]) -> None:
    """Recompute every event hash and the head, as someone without the private key can."""
    previous = bytes(32)
    for record in records:
        if record["type"] == "event":
            state = record["state"].encode()
            previous = event_hash(previous, record["stream"], record["version"], record["topic"], state)
            record["hash"] = previous.hex()
        elif record["type"] == "head":
            record["hash"] = previous.hex()


@pytest.fixture
def exported(database_url: str, pg_schema: str, tmp_path: Path) -> tuple[Path, str, str]:
    """A bundle of one session (CLI export), the public key, and the session's stream id."""
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        for session in ("kept", "other"):
            engine.start_session(session, "cs", user_id="u-7")
            engine.record_step(
                session, "greet", input={"q": "hi"}, usage=LlmUsage(input_tokens=9, output_tokens=2)
            )
            engine.record_step(session, "answer", input={"q": "refund?"})
        public_key = engine.audit.signing.public_hex
        stream = str(engine.session_uuid("kept"))
    bundle = tmp_path / "kept.jsonl"
    result = run_cli(database_url, pg_schema, "audit", "export", "--session", "kept", "--out", str(bundle))
    assert result.returncode == 0, result.stderr
    assert f"--public-key {public_key}" in result.stderr
    return bundle, public_key, stream


def test_an_exported_session_verifies_offline(exported: tuple[Path, str, str]) -> None:
    bundle, public_key, stream = exported
    records = read(bundle)
    assert [r["type"] for r in records] == ["header", "checkpoint", "event", "event", "event", "head"]
    assert {r["stream"] for r in records if r["type"] == "event"} == {stream}
    result = verify(bundle, public_key)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified: 3 events in 1 streams" in result.stdout


def test_an_edited_event_fails_and_is_named(exported: tuple[Path, str, str]) -> None:
    bundle, public_key, stream = exported
    bundle.write_text(bundle.read_text().replace("refund?", "no refund"))
    result = verify(bundle, public_key)
    assert result.returncode == 1
    assert f"stream {stream} version 3: the event does not match its hash" in result.stdout


def test_an_edit_re_chained_without_the_private_key_fails(exported: tuple[Path, str, str]) -> None:
    bundle, public_key, stream = exported
    records = read(bundle)
    records[4]["state"] = records[4]["state"].replace("refund?", "no refund")
    rechain(records)
    write(bundle, records)
    result = verify(bundle, public_key)
    assert result.returncode == 1
    assert f"stream {stream}: its head (version 3) is not in the signed checkpoint" in result.stdout


def test_a_bundle_re_signed_with_another_key_fails(exported: tuple[Path, str, str], tmp_path: Path) -> None:
    bundle, public_key, _ = exported
    records = read(bundle)
    records[4]["state"] = records[4]["state"].replace("refund?", "no refund")
    rechain(records)
    head = records[-1]
    levels = merkle_levels([head_leaf(head["stream"], head["version"], bytes.fromhex(head["hash"]))])
    head["proof"] = [[side, sibling.hex()] for side, sibling in merkle_proof(levels, 0)]
    forger = Ed25519PrivateKey.generate()
    statement = records[1]["statement"]
    statement["root"] = levels[-1][0].hex()
    records[1]["signature"] = forger.sign(signed_message(statement)).hex()
    write(bundle, records)
    assert verify(bundle, public_key).returncode == 1
    assert "signature is not valid" in verify(bundle, public_key).stdout
    # and it verifies only with the forger's own key, which is not the published one
    forged_key = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    assert verify(bundle, forged_key).returncode == 0


def test_a_bundle_missing_its_last_event_fails(exported: tuple[Path, str, str]) -> None:
    bundle, public_key, stream = exported
    records = read(bundle)
    write(bundle, [*records[:4], records[5]])
    result = verify(bundle, public_key)
    assert result.returncode == 1
    assert f"stream {stream}: the chain ends at version 2, the proven head is version 3" in result.stdout


def test_the_whole_log_exports_and_verifies_and_the_cli_checks_a_bundle_too(
    database_url: str, pg_schema: str, exported: tuple[Path, str, str], tmp_path: Path
) -> None:
    _, public_key, _ = exported
    bundle = tmp_path / "all.jsonl"
    assert run_cli(database_url, pg_schema, "audit", "export", "--out", str(bundle)).returncode == 0
    result = verify(bundle, public_key)
    assert result.returncode == 0, result.stdout
    assert "verified: 6 events in 2 streams" in result.stdout
    checked = run_cli(database_url, pg_schema, "audit", "verify", "--file", str(bundle))
    assert checked.returncode == 0, checked.stderr


def test_a_bad_public_key_is_one_line_and_exit_2(exported: tuple[Path, str, str]) -> None:
    bundle, _, _ = exported
    result = verify(bundle, "not-a-key")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: 'not-a-key' is not an Ed25519 public key (64 hex digits, or a file holding them)"
    ]


def test_a_bundle_cut_off_or_missing_a_whole_stream_fails_in_both_verifiers(
    database_url: str, pg_schema: str, exported: tuple[Path, str, str], tmp_path: Path
) -> None:
    # Given an export of the whole log (two streams), then the same bundle without its last
    # stream (a file cut off at a stream's end), without its first stream, and with no stream
    _, public_key, _ = exported
    bundle = tmp_path / "all.jsonl"
    assert run_cli(database_url, pg_schema, "audit", "export", "--out", str(bundle)).returncode == 0
    records = read(bundle)
    heads = [i for i, r in enumerate(records) if r["type"] == "head"]
    assert len(heads) == 2
    cuts = {
        "last stream cut off": records[: heads[0] + 1],
        "first stream removed": [*records[:2], *records[heads[0] + 1 :]],
        "every stream cut off": records[:2],
    }
    for what, kept in cuts.items():
        cut = tmp_path / f"{what}.jsonl"
        write(cut, kept)
        # When it is checked, Then both verifiers refuse it, saying how many streams are missing
        # (it had verified: "1 events in 1 streams"; with none, "NOT verified (0 problems)")
        held = sum(r["type"] == "head" for r in kept)
        expected = f"the header declares 2 streams, the bundle holds {held}"
        offline = verify(cut, public_key)
        assert offline.returncode == 1, (what, offline.stdout)
        assert expected in offline.stdout, (what, offline.stdout)
        checked = run_cli(database_url, pg_schema, "audit", "verify", "--file", str(cut))
        assert checked.returncode == 1, (what, checked.stderr)
        assert expected in checked.stderr, (what, checked.stderr)


def test_a_bundle_that_is_not_text_or_not_a_file_is_named_in_one_line(
    exported: tuple[Path, str, str], tmp_path: Path
) -> None:
    """The offline verifier printed Python's own words: "error: 'utf-8' codec can't decode byte
    0x90 in position 0: invalid start byte" (which file?) and "error: [Errno 21] Is a directory: ..."."""
    _, public_key, _ = exported
    binary = tmp_path / "bundle.bin"
    binary.write_bytes(b"\x90\x00\xff")
    for given, says in ((binary, "not UTF-8 text (invalid start byte)"), (tmp_path, "Is a directory")):
        result = verify(given, public_key)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"error: {given}: {says}"]
