"""Link watching over raw rtnetlink: the parser on crafted and garbage bytes, and the watcher
on this namespace's loopback.  tests/daemons/test_linkwatch_live.py toggles a real veth pair.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack.daemons.mrcd.datapath.linkwatch import (
    IFF_LOWER_UP,
    IFF_UP,
    IFINFOMSG,
    IFLA_IFNAME,
    IFLA_OPERSTATE,
    NLM_F_MULTI,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGHDR,
    RTATTR,
    RTM_DELLINK,
    RTM_NEWLINK,
    Control,
    LinkMessage,
    LinkWatcher,
    OperState,
    getlink_dump_request,
    parse_messages,
    watch_planes,
)

UP = IFF_UP | IFF_LOWER_UP


def _pad(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def attr(atype: int, payload: bytes) -> bytes:
    return _pad(RTATTR.pack(RTATTR.size + len(payload), atype) + payload)


def nlmsg(mtype: int, body: bytes, *, seq: int = 0, flags: int = 0) -> bytes:
    return _pad(NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, flags, seq, 0) + body)


def link(
    name: str | None,
    flags: int,
    *,
    index: int = 7,
    oper: int | None = None,
    mtype: int = RTM_NEWLINK,
    seq: int = 0,
) -> bytes:
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 1, index, flags, 0)
    if name is not None:
        body += attr(IFLA_IFNAME, name.encode() + b"\0")
    if oper is not None:
        body += attr(IFLA_OPERSTATE, bytes([oper]))
    body += attr(99, b"\x01\x02\x03")  # an attribute we do not know
    return nlmsg(mtype, body, seq=seq, flags=NLM_F_MULTI if seq else 0)


# The parser -----------------------------------------------------------------------------------
def test_parses_multipart_dump_with_done() -> None:
    data = (
        link("nic0", UP, index=2, oper=OperState.UP, seq=5)
        + link("nic1", IFF_UP, index=3, oper=OperState.LOWERLAYERDOWN, seq=5)
        + link("lo", UP, index=1, oper=OperState.UNKNOWN, seq=5)
        + nlmsg(NLMSG_DONE, struct.pack("=i", 0), seq=5, flags=NLM_F_MULTI)
    )
    msgs = list(parse_messages(data))
    links = [m for m in msgs if isinstance(m, LinkMessage)]
    assert [(m.ifname, m.index, m.up) for m in links] == [
        ("nic0", 2, True),
        ("nic1", 3, False),
        ("lo", 1, True),
    ]
    assert msgs[-1] == Control(5, done=True)


def test_up_needs_admin_carrier_and_operstate() -> None:
    def up(flags: int, oper: int | None) -> bool:
        (msg,) = parse_messages(link("x", flags, oper=oper))
        assert isinstance(msg, LinkMessage)
        return msg.up

    assert up(UP, None) and up(UP, OperState.UP) and up(UP, OperState.UNKNOWN)
    assert not up(IFF_UP, OperState.UP)  # no carrier
    assert not up(IFF_LOWER_UP, OperState.UP)  # admin down
    assert not up(UP, OperState.DORMANT)
    assert not up(UP, OperState.DOWN)
    (gone,) = parse_messages(link("x", UP, mtype=RTM_DELLINK))
    assert isinstance(gone, LinkMessage) and gone.deleted and not gone.up


def test_error_message_and_request() -> None:
    (err,) = parse_messages(nlmsg(NLMSG_ERROR, struct.pack("=i", -22) + b"\0" * 16, seq=9))
    assert err == Control(9, done=True, error=22)
    req = getlink_dump_request(42)
    length, mtype, flags, seq, _ = NLMSGHDR.unpack_from(req)
    assert (length, mtype, seq) == (len(req), 18, 42) and flags & 0x300


def test_truncated_and_garbage_never_raise() -> None:
    good = link("nic0", UP, oper=OperState.UP) + link("nic1", UP, index=8)
    for cut in range(len(good)):
        msgs = list(parse_messages(good[:cut]))  # whole messages only, never a half one
        assert all(isinstance(m, LinkMessage) and m.ifname in ("nic0", None) for m in msgs)
    # a header whose length runs past the datagram, a zero length, a bad attribute length
    assert list(parse_messages(NLMSGHDR.pack(9999, RTM_NEWLINK, 0, 0, 0) + b"\0" * 40)) == []
    assert list(parse_messages(NLMSGHDR.pack(0, RTM_NEWLINK, 0, 0, 0) * 3)) == []
    body = IFINFOMSG.pack(0, 0, 4, UP, 0) + RTATTR.pack(200, IFLA_IFNAME) + b"nic0\0\0\0\0"
    (msg,) = parse_messages(nlmsg(RTM_NEWLINK, body))
    assert isinstance(msg, LinkMessage) and msg.ifname is None and msg.index == 4


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_raise(data: bytes) -> None:
    list(parse_messages(data))
    list(parse_messages(link("nic0", UP) + data))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 200))
def test_corrupted_messages_never_raise(noise: bytes, at: int) -> None:
    good = bytearray(link("nic0", UP, oper=OperState.UP) + link("nic1", IFF_UP))
    at %= len(good)
    good[at : at + len(noise)] = noise
    list(parse_messages(bytes(good)))


# The watcher on this namespace (no root needed) -------------------------------------------------
async def test_initial_dump_reports_loopback_and_stop_is_clean() -> None:
    seen: list[tuple[str, bool]] = []
    watcher = LinkWatcher(asyncio.get_running_loop(), lambda n, up: seen.append((n, up)), {"lo"})
    watcher.start()
    try:
        assert seen == [("lo", True)]  # reported inside start(): lo is always up
        assert watcher.state == {"lo": True}
        with pytest.raises(RuntimeError):
            watcher.start()
    finally:
        watcher.stop()
    watcher.stop()  # idempotent


async def test_callback_errors_are_contained() -> None:
    calls: list[str] = []

    def bad(name: str, up: bool) -> None:
        calls.append(name)
        raise ValueError("callback bug")

    watcher = LinkWatcher(asyncio.get_running_loop(), bad, None)
    watcher.start()
    watcher.stop()
    assert "lo" in calls  # every link reported despite the exceptions


async def test_watch_planes_maps_interfaces_to_planes_and_names_the_missing_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """mrcd watches the configured interface of each plane; one warning line names those
    that do not exist (a real host left with the testbed's nic0..: nothing would be seen)."""
    missing = "mrcnone" + secrets.token_hex(4)  # 15 characters, surely no interface here
    seen: list[tuple[int, bool]] = []
    with caplog.at_level(logging.WARNING, logger="mrcd"):
        watcher = watch_planes(
            asyncio.get_running_loop(), ["lo", missing], lambda p, up: seen.append((p, up))
        )
    watcher.stop()
    assert seen == [(0, True)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"event=interfaces_missing names={missing} planes=1" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mrcd"):
        watch_planes(asyncio.get_running_loop(), ["lo"], lambda p, up: None).stop()
    assert not caplog.records
