"""``flowledger audit …``: verify the chain, take and export signed checkpoints, export bundles,
chain a log from before the chain (docs/audit.md).

Any finding exits 1; a read of the log that the read horizon held back is reported as
partial (exit 75, "try again"), never as ok. A file the user names is read before anything
else: one that cannot be read exits 74, one whose data is not what it should hold 65.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from flowledger.adapters.cli.consoles import cli_console, transient_progress
from flowledger.adapters.cli.errors import fail, naming, reported_errors
from flowledger.domain.bounds import json_problem
from flowledger.domain.errors import StoredEventAltered, ValidationError
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.audit import AuditReport, verify_log
from flowledger.infrastructure.audit_keys import retired_public_keys, rotate_signing_key, signing_key
from flowledger.infrastructure.budget_audit import budget_problems
from flowledger.infrastructure.postgres.bundles import export_bundle
from flowledger.infrastructure.postgres.chain_findings import ChainReport
from flowledger.infrastructure.postgres.chain_verify import chain_existing, verify_chain
from flowledger.infrastructure.postgres.checkpoints import Checkpoint
from flowledger.infrastructure.postgres.erasure_audit import unrecorded_erasures
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from flowledger.verify import read_public_key, verify_bundle

audit = typer.Typer(
    help="Prove the event log: its hash chain, signed checkpoints, bundles checked offline.",
    no_args_is_help=True,
)
console = cli_console(stderr=True)
PARTIAL_EXIT = 75
"""Like a database that did not answer: nothing is wrong that trying again will not fix."""
MAX_SHOWN = 50
MALFORMED_EXIT = 65
"""A named file that reads but does not hold what it should (sysexits' EX_DATAERR), as
adapters/cli/errors.py exits for one that is not UTF-8 text."""

PublicKey = Annotated[
    str | None,
    typer.Option("--public-key", help="The checkpoint public key (hex, or a file); default: this engine's."),
]


def _public_key(given: str | None) -> bytes:
    """The public key given, else the writers' (from their signing key; none is made here)."""
    if given is not None:
        try:
            return read_public_key(given)
        except ValueError as error:
            raise ValidationError("public_key", str(error)) from None
    return signing_key(Settings.from_env(), make=False).public_bytes


def retired_keys() -> list[bytes]:
    """The retired checkpoint public keys of the key directory, newest first."""
    return list(reversed(retired_public_keys(Settings.from_env())))


def refuse_malformed(what: str, why: str) -> NoReturn:
    """The one ``error:`` line and exit 65: ``what`` names the file's role, ``why`` what is wrong."""
    fail(" ".join(f"{what}: {why}".split()), MALFORMED_EXIT)


MAX_LINE_CHARS = 64 * 1024 * 1024
"""The longest line a JSON-lines file the user names may have (an event's line is a few MB at
most): a longer one, or a file that never ends a line (``/dev/zero``), is refused, not read
into memory until it runs out."""


def bounded_lines(path: Path, what: str) -> Iterator[str]:
    """The lines of a text file the user named, each at most ``MAX_LINE_CHARS`` (else exit 65,
    naming ``what`` and the line). OSError and UnicodeDecodeError go to the exit-code table."""
    with naming(path), path.open(encoding="utf-8") as lines:
        for number, line in enumerate(iter(lambda: lines.readline(MAX_LINE_CHARS + 1), ""), start=1):
            if len(line) > MAX_LINE_CHARS:
                refuse_malformed(what, f"line {number}: longer than {MAX_LINE_CHARS:,} characters")
            yield line


def json_records(path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """Each non-blank line of a JSON-lines file the user named, with its number; a line that is
    not JSON is refused (exit 65, naming ``what`` and the line), as is one too long
    (``bounded_lines``). OSError and UnicodeDecodeError go to the exit-code table (74, 65)."""
    for number, line in enumerate(bounded_lines(path, what), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except (ValueError, RecursionError) as error:
            refuse_malformed(what, f"line {number}: not JSON ({json_problem(error)})")


def _check_anchors(path: Path) -> None:
    """Refuse an anchor file the user named unless every line is a checkpoint record.

    Read here, before the database: a missing file would otherwise read as "no anchors" and a
    stray record as a checkpoint dropped from the database. OSError and UnicodeDecodeError
    go to the exit-code table (74, 65).
    """
    for number, record in json_records(path, "anchors"):
        why = _not_a_checkpoint(record)
        if why:
            refuse_malformed("anchors", f"line {number}: not a checkpoint record ({why})")


def _not_a_checkpoint(record: Any) -> str:
    """Why ``record`` is not what ``audit checkpoints`` writes (empty when it is)."""
    if not isinstance(record, dict) or record.get("type") != "checkpoint":
        return 'no "type": "checkpoint"'
    statement = record.get("statement")
    if not isinstance(statement, dict):
        return "no statement object"
    if type(statement.get("seq")) is not int or type(statement.get("position")) is not int:
        return "its statement has no whole-number seq and position"
    if not isinstance(record.get("signature"), str):
        return "no signature"
    return ""


def _show(problems: list[str]) -> None:
    for problem in problems[:MAX_SHOWN]:
        console.print(f"[red]problem:[/red] {problem}", highlight=False, soft_wrap=True)
    if len(problems) > MAX_SHOWN:
        console.print(f"... and {len(problems) - MAX_SHOWN} more")


def _verdict(
    chain: ChainReport,
    structure: AuditReport | None,
    what: str,
    snapshots: list[str] | None = None,
    *,
    require_proof: bool = False,
) -> None:
    problems = [f.describe() for f in chain.findings] + (structure.problems if structure else [])
    problems += snapshots or []
    _show(problems)
    partial = structure is not None and structure.partial
    # Nothing signed says which events it held: no valid checkpoint, or none signed any event
    # checked (a session written since the latest one said "ok", even with --require-proof).
    unproven = bool(chain.events or chain.archived) and (
        chain.checkpoint is None or (chain.unsigned == chain.events and not chain.archived)
    )
    if problems:
        verdict = f"[red]{len(problems)} problems[/red]"
    elif partial:
        verdict = "[yellow]no problems in what was read, but the read was partial[/yellow]"
    elif unproven:
        # Nothing signed says which events the log held: said "ok" though every checkpoint row
        # had been deleted with the events they signed (no anchor file at hand to name them).
        verdict = "[yellow]no problems found, but not proven: no signed checkpoint covers it[/yellow]"
        if chain.checkpoint is not None:
            verdict = (
                "[yellow]no problems found, but not proven: no signed checkpoint covers it yet"
                " (take one: flowledger audit checkpoint)[/yellow]"
            )
    elif chain.unsigned:
        # A signed log with a tail written since its latest checkpoint (engines take one every
        # few minutes): ok, and proof enough for --require-proof, but the tail is said to be
        # unsigned (it could be deleted from its streams' ends unseen).
        verdict = (
            f"[green]ok[/green], but {chain.unsigned:,} of them are not signed yet"
            " (written since the latest checkpoint)"
        )
    else:
        verdict = "[green]ok[/green]"
    if chain.wrong_key:
        console.print(
            "[yellow]no event's seal checks under this chain key: unless the whole log was forged, it is"
            " not the key the log was sealed with (FLOWLEDGER_CHAIN_KEY, or chain.key in the audit key"
            " directory: use the writers')[/yellow]",
            highlight=False,
            soft_wrap=True,
        )
    archived = f" ({chain.archived:,} archived, proven by their sealed bases)" if chain.archived else ""
    console.print(
        f"{what}: {chain.events:,} events in {chain.streams:,} streams{archived}: {verdict}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"chain checked at {chain.rate:,.0f} events/s ({chain.seconds:.2f} s)"
        + (" since the latest checkpoint" if chain.since_checkpoint else ""),
        highlight=False,
        soft_wrap=True,
    )
    if chain.checkpoint is not None:
        statement = chain.checkpoint.statement
        console.print(
            f"latest checkpoint: {chain.checkpoint.seq} (log position {chain.checkpoint.position:,},"
            f" {statement.get('streams')} streams, {statement.get('created_at')})",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            "no valid checkpoint: nothing signed says which events the log held, so rows deleted from"
            " a stream's end, or whole streams, cannot be seen (none was taken yet, or the checkpoint"
            " table's rows were deleted in the database: verify against an anchor file exported"
            " elsewhere, --anchors, and take one: flowledger audit checkpoint)",
            highlight=False,
            soft_wrap=True,
        )
    if chain.upgraded_through:
        console.print(
            f"events up to log position {chain.upgraded_through:,} were chained after they were written"
            " (`flowledger audit chain`); the chain is original after it",
            highlight=False,
            soft_wrap=True,
        )
    if structure is not None and structure.extent is not None and partial:
        console.print(f"[yellow]{structure.extent.describe()}[/yellow]", highlight=False, soft_wrap=True)
    if problems or (unproven and require_proof):
        raise typer.Exit(1)
    if partial:
        raise typer.Exit(PARTIAL_EXIT)


def _bundle_options_only(*, session: str | None, since_checkpoint: bool, anchors: Path | None) -> None:
    """Refuse the options that check the database's log beside ``--file``: they were ignored,
    and the bundle's "ok" read as if they had been applied."""
    given = [
        option
        for option, used in (
            ("--session", session is not None),
            ("--since-checkpoint", since_checkpoint),
            ("--anchors", anchors is not None),
        )
        if used
    ]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise ValidationError(
            "file", f"a bundle is checked whole (with --public-key only): {', '.join(given)} {verb} not apply"
        )


@audit.command()
def verify(
    session: Annotated[str | None, typer.Option(help="Only this session's stream.")] = None,
    since_checkpoint: Annotated[
        bool, typer.Option("--since-checkpoint", help="Only what follows the latest signed checkpoint.")
    ] = False,
    public_key: PublicKey = None,
    anchors: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoints anchored elsewhere (JSON lines `audit checkpoints` wrote); default: this host's"
            " anchor file."
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(help="Check an exported bundle instead (as python -m flowledger.verify does)."),
    ] = None,
    require_proof: Annotated[
        bool,
        typer.Option(
            "--require-proof",
            help="Exit 1 when no signed checkpoint covers the log, or the session (else 'not proven'"
            " exits 0, as a log before its first checkpoint does).",
        ),
    ] = False,
) -> None:
    """Recompute every stream's chain, check it against the latest signed checkpoint, name what is wrong."""
    with reported_errors():
        if file is not None:
            _bundle_options_only(session=session, since_checkpoint=since_checkpoint, anchors=anchors)
            lines = list(bounded_lines(file, "bundle"))
            report = verify_bundle(lines, _public_key(public_key))
            if not report.ok and public_key is None:
                # Exported before the signing key was replaced: the retired keys checked it then
                report = next((r for r in (verify_bundle(lines, k) for k in retired_keys()) if r.ok), report)
            _show(report.problems)
            if not report.ok:
                console.print(
                    f"{file}: [red]NOT verified[/red] ({len(report.problems)} problems)", highlight=False
                )
                raise typer.Exit(1)
            console.print(
                f"{file}: {report.events:,} events in {report.streams:,} streams: [green]ok[/green]",
                highlight=False,
                soft_wrap=True,
            )
            return
        if anchors is not None:
            _check_anchors(anchors)
        key = None if public_key is None else _public_key(public_key)
        # An engine that appends makes missing keys at its start; this one appends nothing, and
        # the check reads the writers' keys without making any.
        with Engine(settings=Settings.from_env().with_overrides(audit_chain=False)) as engine:
            stream = None if session is None else engine.session_uuid(session)
            whole_log = stream is None and not since_checkpoint
            chain = verify_chain(
                engine.audit,
                stream=stream,
                since_checkpoint=since_checkpoint,
                public_key=key,
                anchors=anchors,
                log_order=not whole_log,  # the structure check below names reordered rows
            )
            if session is not None and not (chain.events or chain.findings or chain.archived):
                # No row, no base, and nothing a checkpoint signed says it had any: unknown. (A
                # row that no longer reads back, an archived stream's base, a whole stream deleted
                # under a checkpoint are the check's to name, not reasons to stop before it.)
                engine.history(session)  # raises SessionNotFound with the caller's id
            structure = None
            if whole_log:
                with transient_progress(console) as progress:
                    task = progress.add_task("decoding every event", total=None)
                    structure = verify_log(
                        engine.log,
                        progress=lambda n: progress.advance(task, n),
                        archived=engine.retention.archived(),
                    )
            snapshots = None
            if not since_checkpoint:
                streams = [stream] if stream is not None else engine.log.snapshotted_streams()
                snapshots = verify_snapshots(
                    engine.log, streams, engine.retention.archived(), engine.audit.snapshot_seal()
                )
            if not since_checkpoint:
                trail = engine.audit
                with trail.connect() as conn:
                    snapshots = (snapshots or []) + unrecorded_erasures(
                        conn, trail.schema, trail.names.events, stream
                    )
                    if whole_log:
                        snapshots += budget_problems(conn, trail.schema, trail.names.events, engine.store)
        what = f"session {session}" if session else "event log"
        _verdict(chain, structure, what, snapshots, require_proof=require_proof)


@audit.command()
def export(
    session: Annotated[str | None, typer.Option(help="Only this session's stream.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write here instead of standard output.")] = None,
) -> None:
    """Write a bundle: events as stored, their hashes, and the signed checkpoint that proves them."""
    with reported_errors(), Engine() as engine:
        streams = None
        if session is not None:
            # It exists if this reads or names an altered row: the checkpoint the export takes
            # refuses what it cannot sign, in its own words
            with suppress(StoredEventAltered):
                engine.history(session)  # raises SessionNotFound with the caller's id
            streams = [engine.session_uuid(session)]
        # Written beside --out and moved into place whole: an export that fails leaves no file
        # it made, and a bundle already there as it was (it had been truncated first).
        partial = _partial_path(out)
        target = _open_for_writing(partial or out, out) if out is not None else sys.stdout
        try:
            summary = export_bundle(engine.audit, target, streams)
        except BaseException:
            if out is not None:
                target.close()
                if partial is not None:
                    partial.unlink(missing_ok=True)
            raise
        if out is not None:
            target.close()
            if partial is not None:
                partial.replace(out)
        left_out = (
            f"; {summary.archived:,} archived stream{'s' if summary.archived != 1 else ''} left out"
            " (their events are in their retention bundles)"
            if summary.archived
            else ""
        )
        console.print(
            f"exported {summary.events:,} events of {summary.streams:,} streams"
            + (f" to {out}" if out else "")
            + f", proven by checkpoint {summary.checkpoint.seq}"
            + f" (log position {summary.checkpoint.position:,})"
            + left_out,
            highlight=False,
            soft_wrap=True,
        )
        console.print(
            f"check it offline: python -m flowledger.verify {out or 'BUNDLE'}"
            f" --public-key {engine.audit.signing.public_hex}",
            highlight=False,
            soft_wrap=True,
        )


def _partial_path(out: Path | None) -> Path | None:
    """Where an export to ``out`` is written first (None: written in place, a device or pipe)."""
    if out is None or (out.exists() and not out.is_file()):
        return None
    return out.with_name(f".{out.name}.{os.getpid()}.partial")


def _open_for_writing(path: Path, named: Path) -> Any:
    """``path`` opened for writing; an OSError names ``named``, the file the user gave."""
    try:
        return path.open("w", encoding="utf-8")
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(named)) from None


@audit.command()
def checkpoint() -> None:
    """Sign the head of every stream now (the latest checkpoint again if nothing was appended)."""
    with reported_errors(), Engine() as engine:
        taken = engine.audit.checkpoint()
        _print_checkpoint(taken)
        console.print(
            f"public key (publish it): {engine.audit.signing.public_hex}", highlight=False, soft_wrap=True
        )


def _print_checkpoint(taken: Checkpoint) -> None:
    statement = taken.statement
    console.print(
        f"checkpoint {taken.seq}: log position {taken.position:,}, {statement.get('streams')} streams,"
        f" root {statement.get('root')}, {statement.get('created_at')}",
        highlight=False,
        soft_wrap=True,
    )


@audit.command()
def checkpoints(
    out: Annotated[Path | None, typer.Option(help="Write here instead of standard output.")] = None,
) -> None:
    """Export every signed checkpoint (JSON lines), to anchor them outside the database."""
    settings = Settings.from_env()
    # An engine that appends makes missing keys at its start; this one only reads (as verify).
    with reported_errors(), Engine(settings=settings.with_overrides(audit_chain=False)) as engine:
        trail = engine.audit
        target = out.open("w", encoding="utf-8") if out is not None else sys.stdout
        count = 0
        try:
            with trail.connect() as conn:
                for stored in trail.checkpoints(conn):
                    if isinstance(stored, Checkpoint):
                        target.write(json.dumps(stored.record(), sort_keys=True) + "\n")
                        count += 1
        finally:
            if out is not None:
                target.close()
        try:
            key = f"; public key {signing_key(settings, make=False).public_hex}"
        except ValidationError:  # none here: each checkpoint names the key that signed it
            key = ""
        console.print(f"exported {count} checkpoints{key}", highlight=False, soft_wrap=True)


@audit.command("public-key")
def public_key_command() -> None:
    """Print the checkpoint public key (hex), for publication."""
    # The writers' key, read without an engine: an engine's start makes missing keys, and
    # printed a public key that signed nothing (engines on this host then sealed under new keys).
    with reported_errors():
        key = signing_key(Settings.from_env(), make=False, reader="audit public-key prints the writers' key")
    typer.echo(key.public_hex)


@audit.command("rotate-signing-key")
def rotate_signing_key_command() -> None:
    """Replace the checkpoint signing key of the key directory; the old public key stays trusted
    (retired.pub) for the checkpoints it signed."""
    with reported_errors():
        old, new = rotate_signing_key(Settings.from_env())
        console.print(
            f"retired {old} (kept in retired.pub: it proves the checkpoints it signed); new public key"
            f" (publish it): {new}. Every engine signs its next checkpoint with the new key",
            highlight=False,
            soft_wrap=True,
        )


@audit.command()
def chain() -> None:
    """Chain events stored without a hash (a log from before the chain); appends wait meanwhile.

    A stream whose rows without a hash do not lead into the hash stored after them (edited, their
    hash removed) is named and left unchained: exit 1."""
    with reported_errors(), Engine() as engine:
        done = chain_existing(engine.audit)
        if not done.rows and not done.refused:
            console.print("every event is already chained", highlight=False, soft_wrap=True)
            return
        if done.rows:
            console.print(
                f"chained {done.rows:,} events of {done.streams:,} streams, up to log position"
                f" {done.through_position:,}; every event after that position was chained when it was"
                " written. Take a checkpoint now to seal them: flowledger audit checkpoint",
                highlight=False,
                soft_wrap=True,
            )
        _show([refused.describe() for refused in done.refused])
        if done.refused:
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` group to the top-level app."""
    app.add_typer(audit, name="audit")
