"""The hashing rules of ``flowledger.verify``: the Merkle tree is RFC 6962's, every proof leads to
the root, and a head's proof does not fit another head."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from flowledger.verify import (
    GENESIS,
    MacKey,
    event_hash,
    event_mac,
    head_leaf,
    merkle_levels,
    merkle_proof,
    merkle_root,
    proven_root,
)


def rfc6962_root(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) of RFC 6962 section 2.1, over leaf hashes, split at the largest power of two < n."""
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + rfc6962_root(leaves[:k]) + rfc6962_root(leaves[k:])).digest()


@given(st.integers(min_value=1, max_value=70))
def test_the_tree_is_rfc_6962s_and_every_proof_leads_to_its_root(n: int) -> None:
    leaves = [head_leaf(f"stream-{i}", i + 1, hashlib.sha256(bytes([i % 256])).digest()) for i in range(n)]
    root = merkle_root(leaves)
    assert root == rfc6962_root(leaves)
    levels = merkle_levels(leaves)
    for index, leaf in enumerate(leaves):
        assert proven_root(leaf, merkle_proof(levels, index)) == root
        if n > 1:
            other = leaves[(index + 1) % n]
            assert proven_root(other, merkle_proof(levels, index)) != root


def test_an_event_hash_covers_every_field_and_its_predecessor() -> None:
    base = event_hash(GENESIS, "s", 1, "t:E", b"{}")
    variants = [
        event_hash(b"\x01" * 32, "s", 1, "t:E", b"{}"),
        event_hash(GENESIS, "s2", 1, "t:E", b"{}"),
        event_hash(GENESIS, "s", 2, "t:E", b"{}"),
        event_hash(GENESIS, "s", 1, "t:F", b"{}"),
        event_hash(GENESIS, "s", 1, "t:E", b"{ }"),
        # length prefixes: moving bytes between fields changes the hash
        event_hash(GENESIS, "s", 1, "t:E{", b"}"),
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)
    assert event_mac(b"k" * 32, "s", 1, base) != event_mac(b"j" * 32, "s", 1, base)
    assert event_mac(b"k" * 32, "s", 1, base) != event_mac(b"k" * 32, "s", 2, base)


@given(
    st.binary(min_size=0, max_size=100),
    st.text(min_size=1, max_size=40),
    st.integers(min_value=1, max_value=2**62),
    st.binary(min_size=32, max_size=32),
)
def test_a_mac_key_seals_as_event_mac_does(key: bytes, stream: str, version: int, chained: bytes) -> None:
    # Keys longer than SHA-256's 64-byte block are hashed first, as RFC 2104 says.
    assert MacKey(key).mac(stream, version, chained) == event_mac(key, stream, version, chained)


def test_a_mac_key_keeps_no_state_between_events() -> None:
    key = MacKey(b"k" * 32)
    first = key.mac("s", 1, GENESIS)
    key.mac("s", 2, b"\x07" * 32)
    assert key.mac("s", 1, GENESIS) == first == event_mac(b"k" * 32, "s", 1, GENESIS)
