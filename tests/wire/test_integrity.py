"""Packet integrity: AEAD tags and keys, the nonce guard, anti-replay, the CRC header check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack.wire import (
    AEAD_TAG_FLAG,
    AEAD_TAG_LEN,
    DATA_HDR_LEN,
    XETH_LEN,
    XFETH_LEN,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    DecodeError,
    DecodeReason,
    Packet,
    ReplayWindow,
    WireUsageError,
    crc32_header,
    decode,
    encode,
    encoded_length,
)
from tests.support.wire import (
    KEY16,
    KEY32,
    PROBE_REPLY,
    RECEIVER_ID,
    XETH_FLAGS_FROM_END,
    ack,
    data,
    make_pair,
)

# --- AEAD ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["aead", "aead-encrypt"])
def test_forged_tag_is_rejected(mode: str) -> None:
    tx, rx = make_pair(mode)
    wire = encode(data(), tx)
    forged = wire[:-AEAD_TAG_LEN] + bytes(AEAD_TAG_LEN)
    with pytest.raises(DecodeError) as info:
        decode(forged, rx)
    assert info.value.reason is DecodeReason.BAD_AUTH


@pytest.mark.parametrize("mode", ["aead", "aead-encrypt"])
def test_wrong_key_or_direction_is_rejected(mode: str) -> None:
    tx, _ = make_pair(mode, KEY16)
    _, other_key_rx = make_pair(mode, bytes(16))
    wire = encode(ack(), tx)
    with pytest.raises(DecodeError) as info:
        decode(wire, other_key_rx)
    assert info.value.reason is DecodeReason.BAD_AUTH
    reflected = AeadIntegrity(KEY16, RECEIVER_ID, 0x77, encrypt=mode == "aead-encrypt")
    with pytest.raises(DecodeError):  # opened with the wrong sender id in the nonce
        decode(wire, reflected)


@pytest.mark.parametrize("pkt", [data(payload=b"y" * 64), ack(), PROBE_REPLY], ids=type)
def test_the_extension_says_which_trailer_and_a_receiver_holds_it_to_its_mode(
    pkt: Packet,
) -> None:
    """AEAD_TAG_FLAG is set exactly when the trailer is an AES-GCM tag (what the dissector
    reads); a packet flagged for the other mode is refused, naming why."""
    tx, rx = make_pair("aead")
    at = encoded_length(pkt, 0) - (XETH_LEN if type(pkt) is DataPacket else XFETH_LEN) + 1
    if type(pkt) is DataPacket:
        at -= len(pkt.payload)
    sealed, plain = encode(pkt, tx), encode(pkt, CrcIntegrity())
    assert sealed[at] & AEAD_TAG_FLAG and not plain[at] & AEAD_TAG_FLAG
    for wire, opener, says in ((plain, rx, "ICRC"), (sealed, CrcIntegrity(), "AES-GCM tag")):
        with pytest.raises(DecodeError) as info:
            decode(wire, opener)
        assert info.value.reason is DecodeReason.BAD_FIELD and says in str(info.value)


def test_encryption_hides_the_payload_and_auth_only_does_not() -> None:
    secret = b"the quick brown fox jumps over the lazy dog" * 2
    for mode, visible in (("aead", True), ("aead-encrypt", False)):
        tx, rx = make_pair(mode, KEY32)
        wire = encode(data(payload=secret), tx)
        assert (secret in wire) is visible
        got = decode(wire, rx)
        assert bytes(got.payload) == secret  # type: ignore[union-attr]


def test_seal_refuses_a_reused_tx_seq() -> None:
    tx, _ = make_pair("aead")
    encode(data(tx_seq=10), tx)
    encode(data(tx_seq=5), tx)  # out of order but never used: fine
    with pytest.raises(WireUsageError, match="nonce"):
        encode(ack(tx_seq=10), tx)


@pytest.mark.parametrize("key", [b"", bytes(15), bytes(24), bytes(33)])
def test_bad_key_lengths(key: bytes) -> None:
    with pytest.raises(WireUsageError):
        AeadIntegrity(key, 1, 2)


def test_ids_must_differ_and_fit() -> None:
    with pytest.raises(WireUsageError):
        AeadIntegrity(KEY16, 3, 3)
    with pytest.raises(WireUsageError):
        AeadIntegrity(KEY16, 1 << 32, 3)


def test_trailer_lengths() -> None:
    assert CrcIntegrity().trailer_len == 4
    assert AeadIntegrity(KEY16, 1, 2).trailer_len == AEAD_TAG_LEN == 16


# --- replay window -------------------------------------------------------------------------


def test_replay_fresh_window_accepts_anything() -> None:
    win = ReplayWindow(64)
    assert win.top == -1
    assert win.check(0)
    assert win.check((1 << 64) - 1)


def test_replay_duplicates_are_rejected_and_check_does_not_record() -> None:
    win = ReplayWindow(64)
    assert win.check(5)
    assert win.check(5)  # check alone records nothing
    win.update(5)
    assert not win.check(5)
    assert win.check(4)
    assert win.check(6)
    win.update(3)  # out of order, inside the window
    assert not win.check(3)
    assert win.check(4)
    assert win.top == 5


def test_replay_old_packets_fall_out_of_the_window() -> None:
    win = ReplayWindow(64)
    win.update(100)
    assert win.check(100 - 63)  # oldest position still tracked
    assert not win.check(100 - 64)  # one further back: too old even though never seen
    win.update(37)
    assert not win.check(37)


def test_replay_far_jump_forgets_the_past() -> None:
    win = ReplayWindow(64)
    for seq in range(10):
        win.update(seq)
    win.update(10_000)
    assert not win.check(9)  # now far too old
    assert win.check(10_000 - 1)
    assert not win.check(10_000)


def test_replay_window_slides_over_many_sizes() -> None:
    size = 128
    win = ReplayWindow(size)
    for seq in range(0, 5 * size, 2):  # even numbers only
        assert win.check(seq)
        win.update(seq)
    top = 5 * size - 2
    for seq in range(top - size + 1, top + 1):
        assert win.check(seq) == (seq % 2 == 1)
    assert not win.check(top - size)


def _unseen(seq: int, top: int, size: int, seen: set[int]) -> bool:
    """The model: what a window of ``size`` that saw ``seen`` (newest ``top``) accepts."""
    return seq > top or (top - seq < size and seq not in seen)


@given(
    size=st.integers(1, 100),
    base=st.sampled_from([0, 1, 5_000, (1 << 64) - 3_000]),
    ops=st.lists(
        st.tuples(
            st.booleans(),
            # mostly the next one or nearly (the usual case), sometimes anywhere near
            st.one_of(st.sampled_from([1, 1, 1, 2, 3, -1, -2]), st.integers(-150, 150)),
        ),
        max_size=300,
    ),
)
@settings(max_examples=300, deadline=None)
def test_replay_window_matches_the_model_for_any_size_and_start(
    size: int, base: int, ops: list[tuple[bool, int]]
) -> None:
    # Moves relative to the newest seen, so jumps ahead, reordering just behind it, far
    # jumps and holes that are never filled all occur, from a fresh window anywhere.
    win = ReplayWindow(size)
    seen: set[int] = set()
    top = -1
    for is_update, step in ops:
        seq = min(max((top if top >= 0 else base) + step, 0), (1 << 64) - 1)
        assert win.check(seq) == _unseen(seq, top, size, seen)
        if is_update:
            win.update(seq)
            seen.add(seq)
            top = max(top, seq)
            assert win.top == top
            for near in range(max(seq - 3, 0), min(seq + 4, 1 << 64)):
                assert win.check(near) == _unseen(near, top, size, seen)
    for near in range(max(top - size - 2, 0), min(top + 2, 1 << 64)):
        assert win.check(near) == _unseen(near, top, size, seen)


def test_replay_window_in_order_run_then_replays() -> None:
    win = ReplayWindow(64)
    for seq in range(1, 1_000):
        assert win.check(seq)
        win.update(seq)
    assert not any(win.check(seq) for seq in range(999 - 63, 1_000))
    assert win.check(1_000)


def test_replay_window_forgets_holes_that_left_it() -> None:
    # Every other datagram lost for good: the window remembers at most 1.5 windows of holes,
    # however long it runs, and still answers right at its edges.
    win = ReplayWindow(64)
    for top in range(0, 100_000, 2):
        win.update(top)
        assert len(win._holes) <= 96
        if top >= 66:
            assert win.check(top - 1) and not win.check(top - 2)
            assert win.check(top - 63) and not win.check(top - 64) and not win.check(top - 65)


def test_replay_window_argument_checks() -> None:
    with pytest.raises(WireUsageError):
        ReplayWindow(0)
    win = ReplayWindow()
    assert win.size == 4096
    with pytest.raises(WireUsageError):
        win.check(-1)
    with pytest.raises(WireUsageError):
        win.update(1 << 64)


def test_replay_window_of_one() -> None:
    win = ReplayWindow(1)
    win.update(7)
    assert not win.check(7)
    assert not win.check(6)  # anything older than the newest is too old
    assert win.check(8)


def test_seal_refuses_a_tx_seq_too_old_to_vouch_for() -> None:
    tx, _ = make_pair("aead")
    encode(data(tx_seq=100_000), tx)
    with pytest.raises(WireUsageError):
        encode(data(tx_seq=1), tx)  # never sealed, but the guard no longer remembers that far


# --- CRC header check ----------------------------------------------------------------------


def test_crc32_header_argument_checks() -> None:
    with pytest.raises(WireUsageError):
        crc32_header(b"\x0a" * 10)  # shorter than a BTH plus hdr_check
    with pytest.raises(WireUsageError):
        crc32_header(b"\x42" + bytes(60))  # opcode without an MRC extension
    with pytest.raises(WireUsageError):
        crc32_header(b"\x11" + bytes(30))  # an ACK header is 68 bytes


def test_crc32_header_ignores_only_the_switch_bits() -> None:
    header = bytearray(encode(data(), CrcIntegrity())[:DATA_HDR_LEN])
    before = crc32_header(header)
    header[DATA_HDR_LEN - XETH_FLAGS_FROM_END] |= 0xC0
    assert crc32_header(header) == before
    header[DATA_HDR_LEN - XETH_FLAGS_FROM_END] ^= DataFlags.RETX
    assert crc32_header(header) != before
    header[-1] ^= 0xFF  # the hdr_check field itself counts as zero
    assert crc32_header(bytes(header)) == crc32_header(bytes(header[:-1]) + b"\x00")
