"""Check a flowledger audit bundle offline, and the hashing rules the engine writes with.

Standalone on purpose: the standard library and ``cryptography`` only, nothing else of
flowledger, so an auditor can read this one file and run it without the database::

    python -m flowledger.verify bundle.jsonl --public-key KEY   # KEY: hex, or a file holding it

The rules (the engine imports them from here, so there is one home for each):

- ``event_hash``: SHA-256 over a domain tag, the previous event's hash in the same stream
  (32 zero bytes before version 1), the stream id, the version, the topic and the stored
  payload bytes (which hold the event's timestamp), each length-prefixed. Anyone can
  recompute it: it is what a bundle is checked with.
- ``event_mac``: HMAC-SHA256 of that hash under the engine's chain key (never stored in the
  database), so that someone who can only write to the database cannot re-chain an edit.
- checkpoints: a Merkle tree (RFC 6962 hashing) over every stream's head
  (stream, version, hash) up to a log position; its root goes into a JSON statement signed
  with Ed25519. A bundle carries each stream's events, the inclusion proof of its head and
  the signed statement: an edit re-chained without the private key changes the head, and
  no proof leads from it to the signed root.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

GENESIS = bytes(32)
"""The ``previous`` hash of every stream's first event."""
BUNDLE_FORMAT = 1
_EVENT_TAG = b"flowledger.event.v1\x00"
_MAC_TAG = b"flowledger.mac.v1\x00"
_CHECKPOINT_TAG = b"flowledger.checkpoint.v1\x00"


def _prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def event_hash(previous: bytes, stream: str, version: int, topic: str, state: bytes) -> bytes:
    """The chained hash of one stored event (``stream``: the aggregate id as ``str(UUID)``)."""
    return hashlib.sha256(
        b"".join(
            (
                _EVENT_TAG,
                previous,
                _prefixed(stream.encode()),
                version.to_bytes(8, "big", signed=True),
                _prefixed(topic.encode()),
                _prefixed(state),
            )
        )
    ).digest()


def _mac_message(stream: str, version: int, chained: bytes) -> bytes:
    return b"".join((_MAC_TAG, _prefixed(stream.encode()), version.to_bytes(8, "big", signed=True), chained))


def event_mac(key: bytes, stream: str, version: int, chained: bytes) -> bytes:
    """The keyed seal of an event's chained hash (binds it to its stream and version too)."""
    return hmac.digest(key, _mac_message(stream, version, chained), "sha256")


class MacKey:
    """``event_mac`` under one key, for sealing many events: the same HMAC-SHA256 (RFC 2104),
    with the key's inner and outer pads hashed once and copied per event.

    Why the engine's appends seal with this: ``hmac.digest`` looks the digest up in OpenSSL
    again and releases the GIL around every call; with eight writer threads each release
    meant queueing for the GIL again (bench/README.md, issue 11, third session).
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\x00")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def mac(self, stream: str, version: int, chained: bytes) -> bytes:
        """``event_mac(key, stream, version, chained)``."""
        inner = self._inner.copy()
        inner.update(_mac_message(stream, version, chained))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def head_leaf(stream: str, version: int, chained: bytes) -> bytes:
    """A checkpoint's Merkle leaf for one stream head."""
    return hashlib.sha256(
        b"\x00" + _prefixed(stream.encode()) + version.to_bytes(8, "big", signed=True) + chained
    ).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree over ``leaves``, leaves first: nodes pair up level by level, and
    an odd last node moves up as it is (the same tree as RFC 6962's)."""
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        paired = [_node(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        levels.append(paired)
    return levels


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over ``leaves`` (the hash of nothing for none)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    return merkle_levels(leaves)[-1][0]


def merkle_proof(levels: Sequence[Sequence[bytes]], index: int) -> list[tuple[str, bytes]]:
    """The siblings from leaf ``index`` up to the root, each with its side (``L`` or ``R``)."""
    proof: list[tuple[str, bytes]] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(("L" if sibling < index else "R", level[sibling]))
        index //= 2
    return proof


def proven_root(leaf: bytes, proof: Iterable[tuple[str, bytes]]) -> bytes:
    """The root that ``proof`` leads to from ``leaf``."""
    node = leaf
    for side, sibling in proof:
        node = _node(sibling, node) if side == "L" else _node(node, sibling)
    return node


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """The canonical bytes of a checkpoint statement (what is signed and digested)."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed_message(statement: dict[str, Any]) -> bytes:
    """What the Ed25519 signature of a checkpoint covers."""
    return _CHECKPOINT_TAG + statement_bytes(statement)


def statement_digest(statement: dict[str, Any]) -> str:
    """A checkpoint's identity: the next checkpoint names it as ``previous``."""
    return hashlib.sha256(statement_bytes(statement)).hexdigest()


def signature_valid(public_key: bytes, statement: dict[str, Any], signature: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``statement`` by ``public_key`` (raw 32 bytes)."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, signed_message(statement))
    except (InvalidSignature, ValueError):
        return False
    return True


def read_public_key(given: str) -> bytes:
    """A raw Ed25519 public key from 64 hex digits, or from a file holding them."""
    text = given.strip()
    shown = repr(given) if len(given) <= 80 else repr(given[:77]) + "..."
    try:
        if len(text) != 64 and Path(text).is_file():
            text = Path(text).read_text(encoding="utf-8").strip()
    except OSError:  # a name too long to be a file's, say: then it is not a file
        pass
    except UnicodeDecodeError:
        raise ValueError(f"{shown} is a file that is not text, not an Ed25519 public key") from None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"{shown} is not an Ed25519 public key (64 hex digits, or a file holding them)")
    return raw


# -- bundles ---------------------------------------------------------------------------------


@dataclass
class BundleReport:
    """What checking a bundle found."""

    events: int = 0
    streams: int = 0
    checkpoint: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    declared: int | None = None
    """How many streams the bundle's header says it holds (the header is not signed: this
    catches a file cut off, or a stream taken out, not a header edited to match)."""

    @property
    def ok(self) -> bool:
        """True when every stream's chain reached a head proven in a validly signed checkpoint."""
        return not self.problems and self.checkpoint is not None and self.streams > 0


@dataclass
class _Stream:
    stream: str
    version: int = 0
    previous: bytes = GENESIS
    broken: bool = False


def verify_bundle(lines: Iterable[str], public_key: bytes) -> BundleReport:
    """Check a bundle: header, signed checkpoint, then per stream its events and proven head."""
    report = BundleReport()
    root: bytes | None = None
    current: _Stream | None = None
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record["type"]
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deep
            report.problems.append(f"line {number}: not a bundle record")
            continue
        try:
            if number == 1 or kind == "header":
                if number != 1 or kind != "header" or record.get("format") != BUNDLE_FORMAT:
                    report.problems.append(f"line {number}: a bundle starts with its header (format 1)")
                elif isinstance(record.get("streams"), int):
                    report.declared = record["streams"]
            elif kind == "checkpoint":
                root = _check_checkpoint(record, public_key, report, number)
            elif kind == "event":
                current = _check_event(record, current, seen, report, number)
            elif kind == "head":
                if current is None or current.stream != record["stream"]:
                    report.problems.append(f"line {number}: a head with no events of its stream before it")
                else:
                    _check_head(record, current, root, report)
                    report.streams += 1
                current = None
            else:
                report.problems.append(f"line {number}: unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as error:
            report.problems.append(f"line {number}: malformed {kind} record ({error})")
    if current is not None:
        report.problems.append(f"stream {current.stream}: its events have no proven head (cut off?)")
    if report.checkpoint is None and not any("checkpoint" in p for p in report.problems):
        report.problems.append("the bundle has no signed checkpoint")
    if report.declared is not None and report.streams != report.declared:
        report.problems.append(
            f"the header declares {report.declared} streams, the bundle holds {report.streams} with a"
            " proven head (cut off, or streams taken out)"
        )
    elif report.streams == 0 and not report.problems:
        report.problems.append("the bundle holds no stream")
    return report


def _check_checkpoint(
    record: dict[str, Any], public_key: bytes, report: BundleReport, number: int
) -> bytes | None:
    statement = record["statement"]
    if report.checkpoint is not None:
        report.problems.append(f"line {number}: a second checkpoint")
        return None
    if not signature_valid(public_key, statement, bytes.fromhex(record["signature"])):
        report.problems.append(
            f"line {number}: the checkpoint's signature is not valid for this public key"
            " (the statement was altered, or signed by another key)"
        )
        return None
    report.checkpoint = statement
    return bytes.fromhex(statement["root"])


def _check_event(
    record: dict[str, Any], current: _Stream | None, seen: set[str], report: BundleReport, number: int
) -> _Stream:
    stream, version = str(record["stream"]), int(record["version"])
    if current is None or current.stream != stream:
        if stream in seen:
            report.problems.append(f"line {number}: stream {stream} appears twice")
        seen.add(stream)
        current = _Stream(stream)
    report.events += 1
    if current.broken:
        return current
    where = f"line {number}: stream {stream} version {version}"
    if version != current.version + 1:
        missing = current.version + 1
        report.problems.append(
            f"{where}: expected version {missing} (a dropped row: version {missing} was removed,"
            " or rows reordered: this one moved)"
        )
        current.broken = True
        return current
    state = record["state"].encode() if "state" in record else _b64(record["state_b64"])
    computed = event_hash(current.previous, stream, version, str(record["topic"]), state)
    if computed.hex() != record["hash"]:
        report.problems.append(f"{where}: the event does not match its hash (an altered row)")
        current.broken = True
        return current
    current.version, current.previous = version, computed
    return current


def _check_head(record: dict[str, Any], current: _Stream, root: bytes | None, report: BundleReport) -> None:
    where = f"stream {current.stream}"
    if current.broken:
        return
    if int(record["version"]) != current.version or record["hash"] != current.previous.hex():
        report.problems.append(
            f"{where}: the chain ends at version {current.version}, the proven head is version"
            f" {record['version']} (a broken head: events dropped or added at the end, or the chain"
            " recomputed)"
        )
        return
    if root is None:
        report.problems.append(f"{where}: no validly signed checkpoint before its head")
        return
    proof = [(str(side), bytes.fromhex(sibling)) for side, sibling in record["proof"]]
    if proven_root(head_leaf(current.stream, current.version, current.previous), proof) != root:
        report.problems.append(
            f"{where}: its head (version {current.version}) is not in the signed checkpoint"
            " (a broken head: the events were altered and re-chained, or the proof is wrong)"
        )


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text, validate=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flowledger.verify bundle.jsonl --public-key KEY``: exit 0 only when it verifies."""
    parser = argparse.ArgumentParser(prog="python -m flowledger.verify", description=__doc__.splitlines()[0])
    parser.add_argument(
        "bundle", type=Path, help="the bundle (JSON lines) that `flowledger audit export` wrote"
    )
    parser.add_argument("--public-key", required=True, help="the checkpoint public key: hex, or a file")
    args = parser.parse_args(argv)
    try:
        key = read_public_key(args.public_key)
        with args.bundle.open(encoding="utf-8") as lines:
            report = verify_bundle(lines, key)
    except UnicodeDecodeError as error:  # a ValueError: said of the bundle, not in Python's words
        print(f"error: {args.bundle}: not UTF-8 text ({error.reason})", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {args.bundle}: {error.strerror or error}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in report.problems:
        print(f"problem: {problem}")
    if not report.ok:
        print(f"{args.bundle}: NOT verified ({len(report.problems)} problems)")
        return 1
    checkpoint = report.checkpoint or {}
    print(
        f"{args.bundle}: verified: {report.events} events in {report.streams} streams, proven by"
        f" checkpoint {checkpoint.get('seq')} (log position {checkpoint.get('position')},"
        f" {checkpoint.get('created_at')})"
    )
    return 0
