"""Signed checkpoints of the event log: every stream head up to a log position, signed (Ed25519).

A checkpoint's statement (``flowledger.verify.statement_bytes``) holds its sequence number,
the log position it covers, the Merkle root over every stream head (stream, version, hash)
up to there, and the digest of the checkpoint before it. Its row also keeps the heads that
changed since that one (packed, compressed), so the heads of any checkpoint are the fold
of its predecessors' and each fold is checked against the signed root before use.

Each checkpoint taken is also appended to an anchor file outside the database
(``<key_dir>/anchors/<database>.jsonl``): a checkpoint dropped from the database is still
known there (``audit verify`` compares). Export them to anchor elsewhere too
(``flowledger audit checkpoints``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.sql import SQL, Identifier

from flowledger.domain.bounds import json_problem, shown
from flowledger.domain.errors import AuditError, ValidationError
from flowledger.infrastructure.audit_keys import (
    RETIRED_KEYS_FILE,
    SigningKey,
    chain_key,
    retired_public_keys,
    signing_key,
)
from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.paths import require_path
from flowledger.infrastructure.postgres.audit_arguments import require_lines, require_public_key
from flowledger.infrastructure.postgres.database import unavailable_as_store_error
from flowledger.infrastructure.postgres.ddl import TableNames
from flowledger.infrastructure.postgres.retention import BASES, bases_table_name
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal
from flowledger.infrastructure.settings import MIN_CHAIN_KEY_BYTES, Settings
from flowledger.verify import (
    BundleReport,
    MacKey,
    head_leaf,
    merkle_levels,
    merkle_proof,
    merkle_root,
    signature_valid,
    signed_message,
    statement_bytes,
    statement_digest,
    verify_bundle,
)

__all__ = ["AuditError", "AuditTrail", "Checkpoint", "Heads"]

Heads = dict[UUID, tuple[int, bytes]]
"""Each stream's head: (version, hash)."""
_HEAD = 16 + 8 + 32
_NO_PREVIOUS = "0" * 64
_ANCHOR_TAIL = 256 * 1024
"""How much of the anchor file's end a checkpoint compares with the database (some 400 checkpoints)."""


@dataclass(frozen=True)
class Checkpoint:
    """One signed checkpoint as stored."""

    seq: int
    position: int
    statement: dict[str, Any]
    signature: bytes
    delta: Heads

    @property
    def digest(self) -> str:
        """What the next checkpoint names as ``previous``."""
        return statement_digest(self.statement)

    def record(self) -> dict[str, Any]:
        """The checkpoint as one JSON line (export, anchor file)."""
        return {"type": "checkpoint", "statement": self.statement, "signature": self.signature.hex()}


def pack_heads(heads: Heads) -> bytes:
    """Heads as 56-byte records (stream, version, hash), compressed."""
    raw = b"".join(s.bytes + v.to_bytes(8, "big", signed=True) + h for s, (v, h) in sorted(heads.items()))
    return zlib.compress(raw, 6)


def unpack_heads(blob: bytes) -> Heads:
    """The heads ``pack_heads`` packed (ValueError when damaged)."""
    try:
        raw = zlib.decompress(blob)
    except zlib.error as error:
        raise ValueError(f"heads do not decompress: {error}") from error
    if len(raw) % _HEAD:
        raise ValueError("heads are not whole records")
    heads: Heads = {}
    for at in range(0, len(raw), _HEAD):
        record = raw[at : at + _HEAD]
        heads[UUID(bytes=record[:16])] = (int.from_bytes(record[16:24], "big", signed=True), record[24:])
    return heads


def ordered_leaves(heads: Heads) -> tuple[list[UUID], list[bytes]]:
    """The streams in leaf order (by their text form) and their Merkle leaves."""
    streams = sorted(heads, key=str)
    return streams, [head_leaf(str(s), heads[s][0], heads[s][1]) for s in streams]


def heads_root(heads: Heads) -> bytes:
    """The Merkle root over ``heads``."""
    return merkle_root(ordered_leaves(heads)[1])


def proofs(heads: Heads, wanted: Iterable[UUID]) -> dict[UUID, list[tuple[str, bytes]]]:
    """The inclusion proofs of the ``wanted`` streams' heads in the root over ``heads``."""
    streams, leaves = ordered_leaves(heads)
    levels = merkle_levels(leaves)
    index = {stream: at for at, stream in enumerate(streams)}
    return {stream: merkle_proof(levels, index[stream]) for stream in wanted if stream in index}


def _always_open(operation: str) -> None:
    """A trail made without an engine is never closed."""


class AuditTrail:
    """The audit operations on one database and schema: checkpoints, and their keys and SQL."""

    def __init__(
        self,
        database_url: str,
        settings: Settings,
        readable_head: Any,
        *,
        app_name: str = "flowledger",
        ensure_open: Callable[[str], None] | None = None,
    ) -> None:
        """``ensure_open(operation)`` raises EngineClosed once the engine's store is closed: a
        trail kept past its engine's close went on reading the log on connections of its own."""
        self.database_url = database_url
        self._ensure_open = ensure_open if ensure_open is not None else _always_open
        self.settings = settings
        self.schema = settings.schema
        self.names = TableNames.for_app(app_name)
        self._readable_head = readable_head
        self._signing: SigningKey | None = None
        self._chain_key: bytes | None = None
        self._fold: tuple[int, str, Heads] | None = None
        """The heads of the last checkpoint this process read or took: (seq, digest, heads)."""

    # -- keys ---------------------------------------------------------------------------

    @property
    def chain_key(self) -> bytes:
        """The chain's HMAC key."""
        if self._chain_key is None:
            self._chain_key = chain_key(self.settings)
        return self._chain_key

    def use_chain_key(self, key: bytes) -> None:
        """Seal and check with ``key``: the engine's, checked against the log at its start
        (``chain_key_check.py``), so that no other is made or read from then on. A key that
        is none (not bytes, under 16 of them) or another than the one in use is a
        ValidationError: the engine's appends go on being sealed with the key it started with,
        so a check under another read every row as forged."""
        if type(key) is not bytes or len(key) < MIN_CHAIN_KEY_BYTES:
            raise ValidationError(
                "key", f"must be a chain key of at least {MIN_CHAIN_KEY_BYTES} bytes, got {shown(key)}"
            )
        if self._chain_key is not None and not hmac.compare_digest(key, self._chain_key):
            raise ValidationError(
                "key",
                "this trail already seals and checks with another chain key: start an engine with"
                " the new one (FLOWLEDGER_CHAIN_KEY) to use it",
            )
        self._chain_key = key

    def chain_key_to_check(self) -> bytes:
        """The chain key as the writers keep it, for checking: a missing one is a
        ValidationError, never made here (a key made by a check would read every seal as
        forged, and the engines on this host would then seal with it)."""
        return self._chain_key if self._chain_key is not None else chain_key(self.settings, make=False)

    def snapshot_seal(self) -> SnapshotSeal:
        """The seal every snapshot must carry (``snapshot_seal.py``), under the key to check."""
        return SnapshotSeal(self.chain_key_to_check())

    def public_key_to_check(self) -> bytes:
        """The checkpoints' public key, from the signing key as the writers keep it (a missing
        one is a ValidationError, never made here)."""
        signing = self._signing if self._signing is not None else signing_key(self.settings, make=False)
        return signing.public_bytes

    def trusted_keys(self, current: bytes) -> list[bytes]:
        """The public keys checkpoints may be signed with, in the order they signed: the retired
        ones (``retired.pub``, oldest first), then ``current`` (32 bytes)."""
        require_public_key("current", current)
        return [key for key in retired_public_keys(self.settings) if key != current] + [current]

    def checked_bundle(self, lines: Sequence[str]) -> BundleReport:
        """``verify_bundle`` under this installation's public key, or else under a retired one
        (a bundle whose checkpoint was signed before the signing key was replaced); the report
        under the current key when none verifies it. ``lines``: the bundle's text lines (a
        list; a string or bytes is a ValidationError, not read a character a line)."""
        self._ensure_open("check a bundle")
        lines = require_lines("lines", lines)
        keys = self.trusted_keys(self.signing.public_bytes)
        first = verify_bundle(lines, keys[-1])
        if first.ok:
            return first
        for key in reversed(keys[:-1]):
            report = verify_bundle(lines, key)
            if report.ok:
                return report
        return first

    @property
    def signing(self) -> SigningKey:
        """The checkpoint signing key."""
        if self._signing is None:
            self._signing = signing_key(self.settings)
        return self._signing

    @property
    def anchor_file(self) -> Path:
        """This database's anchor file (outside the database)."""
        params = conninfo_to_dict(self.database_url)
        where = f"{params.get('host', '')}:{params.get('port', '')}/{params.get('dbname', '')}/{self.schema}"
        name = hashlib.sha256(where.encode()).hexdigest()[:16]
        return self.settings.key_dir / "anchors" / f"{self.schema}-{name}.jsonl"

    # -- SQL ------------------------------------------------------------------------------

    def table(self, name: str) -> SQL | Any:
        """``schema.name`` as a composable (a ``name`` that is no text is a ValidationError)."""
        if not isinstance(name, str) or not name:
            raise ValidationError("name", f"must be a table's name, got {shown(name)}")
        return SQL("{}.{}").format(Identifier(self.schema), Identifier(name))

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of its own (audit reads are long; they do not take the engine's pool);
        EngineClosed once the engine is closed (``verify_chain``, ``export_bundle``, ``heads_at``)."""
        self._ensure_open("audit")
        # Behind PgBouncer (transaction pooling) nothing may be prepared on the server: the
        # next transaction may run on another backend (psycopg prepares a statement's 5th run).
        return psycopg.connect(
            self.database_url,
            connect_timeout=max(2, round(self.settings.connect_deadline_s)),
            prepare_threshold=None if self.settings.pgbouncer else 5,
        )

    def table_dropped(self, conn: psycopg.Connection[Any]) -> str | None:
        """What to say when the checkpoints table is not there (``migrate`` made it, so it was
        dropped in the database, with every checkpoint); None when it is."""
        name = f"{self.schema}.{self.names.checkpoints}"
        found = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [self.table(self.names.checkpoints).as_string(conn)]
        ).fetchone()
        if found and found[0]:
            return None
        return (
            f"the checkpoint table {name} is missing: it was dropped in the database,"
            " with every checkpoint it held"
        )

    def checkpoints(self, conn: psycopg.Connection[Any]) -> Iterator[Checkpoint | tuple[int, str]]:
        """Every stored checkpoint in order; a row that does not parse as ``(seq, reason)``.
        ``AuditError`` when the table was dropped (it was psycopg's "relation … does not exist",
        out of ``audit verify`` and every checkpoint an engine took)."""
        dropped = self.table_dropped(conn)
        if dropped is not None:
            raise AuditError(f"{dropped}; run flowledger audit verify")
        rows = conn.execute(
            SQL("SELECT seq, position, statement, signature, heads FROM {} ORDER BY seq").format(
                self.table(self.names.checkpoints)
            )
        )
        for seq, position, statement, signature, heads in rows:
            try:
                parsed = json.loads(bytes(statement))
                if not isinstance(parsed, dict):
                    raise ValueError("the statement is not an object")
                yield Checkpoint(
                    int(seq), int(position), parsed, bytes(signature), unpack_heads(bytes(heads))
                )
            except ValueError as error:
                yield (int(seq), str(error))

    # -- taking one ---------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """Sign the heads of every stream up to the readable end of the log (the latest
        checkpoint again when nothing was appended since); ``StoreUnavailable`` when the
        database cannot be reached within the operation deadline."""
        with operation_deadline(self.settings.operation_deadline_s), unavailable_as_store_error("checkpoint"):
            return self._checkpoint()

    def _checkpoint(self) -> Checkpoint:
        position = int(self._readable_head() or 0)
        with self.connect() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key(),))
            # Read again under the lock, not kept from the engine's start: after `audit
            # rotate-signing-key` every engine signs with the new key from its next checkpoint
            # on, and none with the retired one after the new one has signed.
            signing = self._signing = signing_key(self.settings)
            stored = self._valid(self.checkpoints(conn))
            self._refuse_unsigned(stored, signing)
            self._refuse_unanchored(stored)
            previous = stored[-1] if stored else None
            if previous is not None and previous.position >= position:
                return previous
            heads = self._heads_of(stored)
            delta = self._changed(conn, previous.position if previous else 0, position)
            self._refuse_rewritten(conn, heads, delta, previous)
            self._refuse_unsealed(conn, heads, delta)
            heads.update(delta)
            seq = (previous.seq if previous else 0) + 1
            statement: dict[str, Any] = {
                "format": 1,
                "seq": seq,
                "position": position,
                "streams": len(heads),
                "root": heads_root(heads).hex(),
                "previous": previous.digest if previous else _NO_PREVIOUS,
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "schema": self.schema,
                "public_key": signing.public_hex,
            }
            taken = Checkpoint(seq, position, statement, signing.sign(signed_message(statement)), delta)
            conn.execute(
                SQL(
                    "INSERT INTO {} (seq, position, statement, signature, heads) VALUES (%s, %s, %s, %s, %s)"
                ).format(self.table(self.names.checkpoints)),
                (taken.seq, position, statement_bytes(statement), taken.signature, pack_heads(delta)),
            )
        self._fold = (taken.seq, taken.digest, heads)
        self._anchor(taken)
        return taken

    def heads_at(self, checkpoint: Checkpoint) -> Heads:
        """Every stream head of ``checkpoint`` (folded from the stored deltas, checked against its root)."""
        if not isinstance(checkpoint, Checkpoint):
            raise ValidationError(
                "checkpoint", f"must be a Checkpoint (audit.checkpoint()), got {shown(checkpoint)}"
            )
        with unavailable_as_store_error("read checkpoints"), self.connect() as conn:
            stored = [c for c in self._valid(self.checkpoints(conn)) if c.seq <= checkpoint.seq]
        heads = self._heads_of(stored)
        if heads_root(heads).hex() != checkpoint.statement.get("root"):
            raise AuditError(f"the stored heads of checkpoint {checkpoint.seq} do not match its signed root")
        return heads

    @staticmethod
    def _valid(stored: Iterator[Checkpoint | tuple[int, str]]) -> list[Checkpoint]:
        """The checkpoints, or AuditError naming the first damaged one."""
        valid: list[Checkpoint] = []
        for checkpoint in stored:
            if not isinstance(checkpoint, Checkpoint):
                seq, reason = checkpoint
                raise AuditError(f"checkpoint {seq} is damaged ({reason}); run audit verify")
            valid.append(checkpoint)
        return valid

    def _heads_of(self, stored: list[Checkpoint]) -> Heads:
        """The fold of ``stored``, checked against the last one's signed root."""
        if not stored:
            return {}
        last = stored[-1]
        if self._fold is not None and self._fold[:2] == (last.seq, last.digest):
            return dict(self._fold[2])
        heads: Heads = {}
        for checkpoint in stored:
            heads.update(checkpoint.delta)
        if heads_root(heads).hex() != last.statement.get("root"):
            raise AuditError(
                f"the stored heads of checkpoint {last.seq} do not match its signed root; run audit verify"
            )
        self._fold = (last.seq, last.digest, heads)
        return dict(heads)

    def _changed(self, conn: psycopg.Connection[Any], after: int, through: int) -> Heads:
        """The heads of the streams appended to in (after, through]."""
        rows = conn.execute(
            SQL(
                "SELECT DISTINCT ON (originator_id) originator_id, originator_version, event_hash, "
                "notification_id FROM {} WHERE notification_id > %s AND notification_id <= %s "
                "ORDER BY originator_id, originator_version DESC"
            ).format(self.table(self.names.events)),
            (after, through),
        ).fetchall()
        unchained = [row for row in rows if row[2] is None]
        if unchained:
            raise AuditError(
                f"{len(unchained)} streams end in events stored without a hash (first: {unchained[0][0]}"
                f" version {unchained[0][1]}); run `flowledger audit chain` before taking a checkpoint"
            )
        return {row[0]: (int(row[1]), bytes(row[2])) for row in rows}

    def _refuse_unsigned(self, stored: list[Checkpoint], signing: SigningKey) -> None:
        """AuditError unless ``stored`` is a chain of checkpoints this installation signed: the
        latest validly signed by its key or a retired one, each before it named (by digest) as
        ``previous`` by the one after, each row's seq and position its statement's, and no
        retired key named after a later one.

        A checkpoint builds on the heads the stored ones fold to: a row inserted by SQL whose
        heads were a session rewritten with its public hashes recomputed (its signature made up)
        had been built on, so the next checkpoint signed the rewritten session, and a bundle of it
        verified offline with the published key. One signature check, and one digest per checkpoint."""
        if not stored:
            return
        keys = [key.hex() for key in self.trusted_keys(signing.public_bytes)]
        last = stored[-1]
        named = last.statement.get("public_key")
        if named not in keys or not signature_valid(bytes.fromhex(named), last.statement, last.signature):
            raise AuditError(
                f"checkpoint refused: checkpoint {last.seq}, the latest stored, is not signed by this"
                " installation's signing key nor a retired one (inserted or altered in the database; or,"
                " if the signing key was replaced, its old public key is missing from"
                f" {self.settings.key_dir / RETIRED_KEYS_FILE}); run flowledger audit verify"
            )
        rank = len(keys)  # the index of the key that signed the checkpoint after (none yet)
        after: Checkpoint | None = None
        for checkpoint in reversed(stored):
            statement = checkpoint.statement
            signer = statement.get("public_key")
            at = keys.index(signer) if signer in keys else -1
            if statement.get("seq") != checkpoint.seq or statement.get("position") != checkpoint.position:
                why = f"checkpoint {checkpoint.seq}'s row differs from its signed statement"
            elif after is not None and after.statement.get("previous") != checkpoint.digest:
                why = f"checkpoint {after.seq} does not follow checkpoint {checkpoint.seq}"
            elif at < 0:
                why = (
                    f"checkpoint {checkpoint.seq} names a key that is neither this installation's nor retired"
                )
            elif at > rank:
                why = f"checkpoint {checkpoint.seq} names a key retired before the one that signed the next"
            else:
                rank, after = at, checkpoint
                continue
            raise AuditError(
                f"checkpoint refused: {why} (altered, inserted or replaced in the database); run"
                " flowledger audit verify"
            )
        if after is not None and after.statement.get("previous") != _NO_PREVIOUS:
            raise AuditError(
                f"checkpoint refused: checkpoint {after.seq}, the first stored, names one before it"
                " (checkpoints dropped from the database); run flowledger audit verify"
            )

    def _refuse_unanchored(self, stored: list[Checkpoint]) -> None:
        """AuditError when this host's anchor file holds a recent checkpoint that the database
        does not, or another in its place: the newest checkpoints deleted there (with what they
        signed, or the log rolled back from a copy). Signing over that had vouched for the log
        without what they signed: checkpoint 2 deleted with the session it signed, the next one
        was a new checkpoint 2 with a valid signature. Only the file's last ``_ANCHOR_TAIL``
        bytes are read (the newest checkpoints; a file of years is not read whole every five
        minutes), and lines that do not read are passed over (``audit verify`` names them)."""
        path = self.anchor_file
        try:
            with path.open("rb") as anchors:
                size = anchors.seek(0, os.SEEK_END)
                anchors.seek(max(0, size - _ANCHOR_TAIL))
                tail = anchors.read()
        except FileNotFoundError:
            return
        lines = tail.split(b"\n")
        if size > _ANCHOR_TAIL:
            lines = lines[1:]  # the first may be the end of a line cut by the seek
        digests = {checkpoint.seq: checkpoint.digest for checkpoint in stored}
        for line in lines:
            try:
                statement = json.loads(line)["statement"]
                seq = statement["seq"]
            except (ValueError, KeyError, TypeError, RecursionError):
                continue
            if not isinstance(statement, dict) or type(seq) is not int:
                continue
            if seq in digests and digests[seq] == statement_digest(statement):
                continue
            where = "is not in the database" if seq not in digests else "is not the one in the database"
            raise AuditError(
                f"checkpoint refused: checkpoint {seq}, anchored in {path}, {where} (deleted or replaced"
                " there, perhaps with what it signed; if the database was restored from a backup, or this"
                " schema made again, on purpose: move that file aside); run flowledger audit verify"
            )

    def _refuse_rewritten(
        self, conn: psycopg.Connection[Any], heads: Heads, delta: Heads, previous: Checkpoint | None
    ) -> None:
        """AuditError when a head the previous checkpoint signed is no longer in its stream's
        chain (the signed last event deleted or altered, then its version written again): signing
        over it would make the latest checkpoint vouch for the rewritten stream, and
        ``audit verify --since-checkpoint`` compares with the latest only. A head at or before an
        archived stream's base has no row (the base keeps it)."""
        moved = [
            (stream, *heads[stream]) for stream, head in delta.items() if heads.get(stream, head) != head
        ]
        if not moved or previous is None:
            return
        rows = conn.execute(
            SQL(
                "SELECT h.id, h.v, e.originator_id IS NULL FROM unnest(%s::uuid[], %s::bigint[], %s::bytea[])"
                " AS h(id, v, hash) LEFT JOIN {} e ON e.originator_id = h.id AND e.originator_version = h.v"
                " WHERE e.event_hash IS DISTINCT FROM h.hash ORDER BY h.id"
            ).format(self.table(self.names.events)),
            [[m[i] for m in moved] for i in range(3)],
        ).fetchall()
        bases = self._archived_through(conn, [row[0] for row in rows if row[2]])
        for stream, version, missing in rows:
            if missing and bases.get(stream, 0) >= version:
                continue
            raise AuditError(
                f"checkpoint refused: stream {stream} version {version}, signed by checkpoint"
                f" {previous.seq}, is no longer stored with the hash it was signed with (deleted or altered,"
                " then written again); run flowledger audit verify"
            )

    def _refuse_unsealed(self, conn: psycopg.Connection[Any], heads: Heads, delta: Heads) -> None:
        """AuditError when a row the checkpoint would vouch for (each changed stream's rows after
        the head signed before, through its new head) has a hash but not its seal under the chain
        key: a row inserted, or altered and re-hashed, in the database. Its public hash fits, so a
        bundle signed over it verified offline. (Rows stored without a hash are ``audit verify``'s
        ``unchained``; an unchained head is refused by ``_changed``.)"""
        if not delta:
            return
        streams = list(delta)
        key = MacKey(self.chain_key)
        query = SQL(
            "SELECT e.originator_id, e.originator_version, e.event_hash, e.event_mac FROM"
            " unnest(%s::uuid[], %s::bigint[], %s::bigint[]) AS h(id, after, through) JOIN {} e"
            " ON e.originator_id = h.id AND e.originator_version > h.after"
            " AND e.originator_version <= h.through"
            " WHERE e.event_hash IS NOT NULL"
        ).format(self.table(self.names.events))
        params = [streams, [heads.get(s, (0, b""))[0] for s in streams], [delta[s][0] for s in streams]]
        with conn.cursor(name="checkpoint_seals") as cur:
            cur.itersize = 5000
            cur.execute(query, params)
            for stream, version, chained, mac in cur:
                if mac is not None and hmac.compare_digest(
                    key.mac(str(stream), version, bytes(chained)), bytes(mac)
                ):
                    continue
                raise AuditError(
                    f"checkpoint refused: stream {stream} version {version} is not sealed with the chain key"
                    " (a row inserted, or altered and re-hashed, in the database; or sealed under another"
                    " chain key); run flowledger audit verify"
                )

    def _archived_through(self, conn: psycopg.Connection[Any], streams: list[UUID]) -> dict[UUID, int]:
        """The last version each of ``streams`` has archived in its retention base (none: absent)."""
        if not streams:
            return {}
        found = conn.execute("SELECT to_regclass(%s)", (bases_table_name(self.schema),)).fetchone()
        if found is None or found[0] is None:
            return {}
        rows = conn.execute(
            SQL("SELECT stream_id, through_version FROM {} WHERE stream_id = ANY(%s)").format(
                self.table(BASES)
            ),
            (streams,),
        ).fetchall()
        return {stream: int(through) for stream, through in rows}

    def _lock_key(self) -> int:
        digest = hashlib.blake2b(f"flowledger-checkpoint:{self.schema}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def _anchor(self, checkpoint: Checkpoint) -> None:
        path = self.anchor_file
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = json.dumps(checkpoint.record(), sort_keys=True).encode() + b"\n"
        with path.open("a+b") as out:
            if out.seek(0, os.SEEK_END) > 0:
                out.seek(-1, os.SEEK_END)
                if out.read(1) != b"\n":
                    # A line cut short (a crash mid-write, a hand edit) is not continued by this record.
                    line = b"\n" + line
            out.write(line)

    def anchored(self, path: str | Path | None = None) -> list[dict[str, Any]]:
        """The checkpoint records in an anchor file (``path``, a path or a string naming one;
        this database's by default; none if absent).

        Raises AuditError naming the file and line when a line is not a JSON object: a damaged
        anchor file cannot vouch for the checkpoints, and is said to be so, not skipped (so is
        one that is not UTF-8 text). What is no path, or a ``path`` given that cannot be read
        (a directory), is a ValidationError naming it; this installation's own file that cannot
        be read is the OSError it is (the CLI's exit 74)."""
        self._ensure_open("read the anchor file")
        target = self.anchor_file if path is None else require_path("path", path)
        if not target.exists():
            return []
        try:
            text = target.read_text(encoding="utf-8")
        except OSError as error:
            if path is None:
                raise
            raise ValidationError("path", f"cannot read the anchor file {target}: {error.strerror}") from None
        except UnicodeDecodeError as error:
            raise AuditError(
                f"the anchor file {target} is not UTF-8 text (byte {error.start}):"
                " it holds no checkpoint records"
            ) from None
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as error:
                raise AuditError(
                    f"the anchor file {target}, line {number}, is not JSON ({json_problem(error)})"
                ) from None
            if not isinstance(record, dict):
                raise AuditError(f"the anchor file {target}, line {number}, is not a checkpoint record")
            records.append(record)
        return records
