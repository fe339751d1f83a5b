"""The control channel over real TCP on loopback: sessions, requests, and hostile input."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterator

import pytest

from mrcstack.api.limits import MAX_PRIVATE_DATA
from mrcstack.daemons.mrcd.control.auth import (
    MSG2_SIZE,
    Credentials,
    Initiator,
    Responder,
    generate_keypair,
)
from mrcstack.daemons.mrcd.control.client import (
    Accept,
    ConnectRejectedError,
    ConnectRequest,
    ControlClient,
    Reject,
    Session,
)
from mrcstack.daemons.mrcd.control.records import (
    ControlError,
    RecordLayer,
    decode_busy,
    derive_qp_key,
    encode_busy,
    encode_frame,
    read_frame,
)
from mrcstack.daemons.mrcd.control.server import (
    BUSY_RETRY_AFTER,
    ControlServer,
    LogLimit,
    admission,
)
from mrcstack.errors import LocalError

PSK = bytes(range(32))
SERVER = "h1"
REJECTED_SERVICE = 13
FAILING_SERVICE = 666
SLOW_SERVICE = 50  # waits until a FAST_SERVICE request has been answered
FAST_SERVICE = 51


class Hooks:
    """A stand-in for the node: accepts CONNECTs, records what it saw."""

    def __init__(self) -> None:
        self.requests: list[ConnectRequest] = []
        self.keys: dict[int, bytes] = {}
        self.port_status: list[tuple[int, int]] = []
        self.lost: list[tuple[str, str]] = []
        self.next_qpn = 100
        self.fast_done = asyncio.Event()
        self.block = asyncio.Event()

    async def on_connect(self, req: ConnectRequest) -> Accept | Reject:
        self.requests.append(req)
        await asyncio.sleep(0)  # let concurrent requests interleave
        if req.service == REJECTED_SERVICE:
            return Reject("no listener on service 13")
        if req.service == FAILING_SERVICE:
            raise RuntimeError("node bug")
        if req.service == SLOW_SERVICE:
            await self.fast_done.wait()
        if req.service == 99:
            await self.block.wait()
        qpn = self.next_qpn
        self.next_qpn += 1
        self.keys[qpn] = req.derive_qp_key(1, qpn)
        if req.service == FAST_SERVICE:
            self.fast_done.set()
        return Accept(qpn, 7, b"srv:" + req.private_data)

    def on_port_status(self, host: int, bitmap: int) -> None:
        self.port_status.append((host, bitmap))

    instance = "5eed"

    def on_session_lost(self, peer_host: str, reason: str) -> None:
        self.lost.append((peer_host, reason))


def psk(host: str, key: bytes = PSK) -> Credentials:
    return Credentials.from_psk(host, key)


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
async def server(hooks: Hooks) -> AsyncIterator[ControlServer]:
    srv = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0), handshake_timeout=0.5)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
async def client() -> AsyncIterator[ControlClient]:
    cli = ControlClient("h0", psk("h0"))
    try:
        yield cli
    finally:
        await cli.close()


async def session(server: ControlServer, client: ControlClient) -> Session:
    return await client.open_session(SERVER, server.address)


async def connect(sess: Session, service: int = 1, src_host: int = 0, qpn: int = 5) -> Accept:
    return await sess.connect(
        src_host=src_host,
        src_qpn=qpn,
        src_psn=9,
        service=service,
        planes=4,
        mtu_payload=4096,
        private_data=b"hello",
    )


async def still_serves(server: ControlServer, host: str = "h6") -> None:
    """A good client (a fresh session) still gets through."""
    cli = ControlClient(host, psk(host))
    try:
        sess = await cli.open_session(SERVER, server.address)
        assert await sess.ping() >= 0
    finally:
        await cli.close()


async def send_raw(server: ControlServer, data: bytes, *, finish: bool = True) -> bytes:
    """Send bytes on a fresh connection; everything the server says back, until it closes."""
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        writer.write(data)
        await writer.drain()
        if finish:
            writer.write_eof()
        return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def raw_session(
    server: ControlServer, host: str = "h0"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, RecordLayer, list[bytes]]:
    """A hand-driven authenticated connection; also returns the handshake as sent."""
    init = Initiator(psk(host), SERVER)
    reader, writer = await asyncio.open_connection(*server.address)
    msg1 = init.start()
    writer.write(encode_frame(msg1))
    msg2 = await read_frame(reader, 256)
    assert msg2 is not None
    msg3 = init.receive(msg2)
    assert msg3 is not None
    writer.write(encode_frame(msg3))
    await writer.drain()
    return reader, writer, RecordLayer(init.result), [msg1, msg3]


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


# Sessions and keys -----------------------------------------------------------------------
async def test_psk_session_ping_and_qp_keys(
    server: ControlServer, client: ControlClient, hooks: Hooks
) -> None:
    sess = await session(server, client)
    assert sess.peer_host == SERVER
    assert await sess.ping() >= 0
    acc = await connect(sess)
    assert acc == Accept(100, 7, b"srv:hello")
    req = hooks.requests[0]
    assert (req.peer_host, req.src_host, req.src_qpn, req.src_psn) == ("h0", 0, 5, 9)
    assert (req.service, req.planes, req.mtu_payload, req.private_data) == (1, 4, 4096, b"hello")
    key = sess.derive_qp_key(0, 5, 1, acc.dst_qpn)
    assert len(key) == 32 and key == hooks.keys[acc.dst_qpn]
    assert key != sess.derive_qp_key(0, 6, 1, acc.dst_qpn)
    assert server.stats.sessions == 1 and server.stats.active == 1
    assert server.stats.requests == {"PING": 1, "CONNECT": 1}


@pytest.mark.parametrize("loopback", ["::1", "127.0.0.1"])
async def test_keypair_session(loopback: str) -> None:
    keys = {h: generate_keypair() for h in ("h0", "h1")}

    def creds(host: str) -> Credentials:
        return Credentials.from_keypair(
            host, keys[host][0], {h: pub for h, (_, pub) in keys.items() if h != host}
        )

    hooks = Hooks()
    srv = ControlServer("h1", creds("h1"), hooks, (loopback, 0))
    cli = ControlClient("h0", creds("h0"), {"h1": (loopback, 0)})
    await srv.start()
    try:
        cli.peers["h1"] = srv.address
        sess = await cli.open_session("h1")
        acc = await connect(sess)
        assert sess.derive_qp_key(0, 5, 1, acc.dst_qpn) == hooks.keys[acc.dst_qpn]
    finally:
        await cli.close()
        await srv.stop()


def test_derive_qp_key_is_symmetric_and_specific() -> None:
    secret = os.urandom(32)
    key = derive_qp_key(secret, 0, 5, 1, 100)
    assert key == derive_qp_key(secret, 0, 5, 1, 100)
    assert (
        len({key, derive_qp_key(secret, 1, 100, 0, 5), derive_qp_key(os.urandom(32), 0, 5, 1, 100)})
        == 3
    )
    with pytest.raises(LocalError):
        derive_qp_key(secret, 0, 1 << 24, 1, 100)


async def test_session_reuse(server: ControlServer, client: ControlClient) -> None:
    first, second = await asyncio.gather(session(server, client), session(server, client))
    assert first is second
    assert await session(server, client) is first
    await first.close()
    third = await session(server, client)
    assert third is not first and await third.ping() >= 0
    with pytest.raises(ControlError):
        await first.ping()


# Requests --------------------------------------------------------------------------------
async def test_connect_reject_and_hook_failure(
    server: ControlServer, client: ControlClient
) -> None:
    sess = await session(server, client)
    with pytest.raises(ConnectRejectedError, match="no listener"):
        await connect(sess, service=REJECTED_SERVICE)
    with pytest.raises(ConnectRejectedError, match="internal error"):
        await connect(sess, service=FAILING_SERVICE)
    # A peer may only connect its own QPs: src_host must be the authenticated host.
    with pytest.raises(ConnectRejectedError, match="src_host 3"):
        await connect(sess, src_host=3)
    assert (await connect(sess)).dst_qpn == 100


async def test_bad_requests_get_error_and_keep_the_session(
    server: ControlServer, client: ControlClient, hooks: Hooks
) -> None:
    sess = await session(server, client)
    await sess.port_status(0, 0b1011)
    assert hooks.port_status == [(0, 0b1011)]
    for msg in (
        {"type": "PORT_STATUS", "host": 5, "port_bitmap": 1},  # not its own ports
        {"type": "PORT_STATUS", "host": 0, "port_bitmap": -1},
        {"type": "CONNECT", "src_host": 0, "src_qpn": 1 << 24},
        {"type": "CONNECT", "src_host": 0, "src_qpn": 1, "src_psn": 1, "service": 1,
         "planes": 1, "mtu_payload": 1, "private_data": "not base64!"},
        {"type": "PING", "ts": "now"},
        {"type": "EV_PROBE"},  # reserved
        {"type": "NOPE"},
    ):  # fmt: skip
        with pytest.raises(ControlError) as err:
            await sess.request(msg)
        assert err.value.reason == "error"
    assert server.stats.bad_requests == 7 and not server.stats.rejected
    assert await sess.ping() >= 0
    with pytest.raises(LocalError):  # too big to send: refused locally
        await sess.request({"type": "PING", "pad": "x" * 70000})


async def test_private_data_limit_both_ways(
    server: ControlServer, client: ControlClient, hooks: Hooks
) -> None:
    """MAX_PRIVATE_DATA (the API's limit too) bounds a CONNECT and its ACCEPT."""
    sess = await session(server, client)

    async def connect_with(data: bytes) -> Accept:
        return await sess.connect(src_host=0, src_qpn=5, src_psn=9, service=1, planes=4,
                                  mtu_payload=4096, private_data=data)  # fmt: skip

    accepted = await connect_with(bytes(MAX_PRIVATE_DATA - 4))  # the hooks add "srv:"
    assert accepted.private_data == b"srv:" + bytes(MAX_PRIVATE_DATA - 4)
    # Exactly the limit reaches the node; its answer, 4 bytes longer, is refused here.
    with pytest.raises(
        ControlError, match=f"private_data: at most {MAX_PRIVATE_DATA} bytes, got 260"
    ) as err:
        await connect_with(bytes(MAX_PRIVATE_DATA))
    assert err.value.reason == "bad_message"
    assert len(hooks.requests[-1].private_data) == MAX_PRIVATE_DATA
    # One byte more never reaches the node: the server answers ERROR, the session stays.
    seen = len(hooks.requests)
    with pytest.raises(ControlError, match=f"at most {MAX_PRIVATE_DATA} bytes, got 257") as err:
        await connect_with(bytes(MAX_PRIVATE_DATA + 1))
    assert err.value.reason == "error" and len(hooks.requests) == seen
    assert await sess.ping() >= 0


async def test_answers_may_come_out_of_order(server: ControlServer, client: ControlClient) -> None:
    sess = await session(server, client)
    slow = asyncio.create_task(connect(sess, service=SLOW_SERVICE, qpn=1))
    await asyncio.sleep(0)
    fast = await connect(sess, service=FAST_SERVICE, qpn=2)
    assert fast.dst_qpn == 100 and (await slow).dst_qpn == 101


async def test_concurrent_sessions(server: ControlServer, hooks: Hooks) -> None:
    hosts = ["h0", "h2", "h3", "h4", "h5", "h7"]
    clients = [ControlClient(h, psk(h)) for h in hosts]
    try:

        async def one(cli: ControlClient, index: int) -> None:
            sess = await cli.open_session(SERVER, server.address)
            accs = await asyncio.gather(
                *(connect(sess, src_host=index, qpn=q) for q in range(1, 11))
            )
            for q, acc in zip(range(1, 11), accs, strict=True):
                assert sess.derive_qp_key(index, q, 1, acc.dst_qpn) == hooks.keys[acc.dst_qpn]

        await asyncio.gather(*(one(c, int(h[1:])) for c, h in zip(clients, hosts, strict=True)))
    finally:
        for cli in clients:
            await cli.close()
    assert len(hooks.keys) == 60
    assert server.stats.sessions == len(hosts) and not server.stats.rejected


async def test_request_timeout_keeps_the_session(
    server: ControlServer, client: ControlClient, hooks: Hooks
) -> None:
    sess = await session(server, client)
    with pytest.raises(TimeoutError):
        await sess.connect(
            src_host=0, src_qpn=1, src_psn=0, service=99, planes=1, mtu_payload=1, timeout=0.05
        )
    hooks.block.set()  # the late ACCEPT arrives and is dropped
    assert not sess.closed and await sess.ping() >= 0


async def test_stop_fails_pending_requests(hooks: Hooks) -> None:
    srv = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0))
    await srv.start()
    cli = ControlClient("h0", psk("h0"))
    try:
        sess = await cli.open_session(SERVER, srv.address)
        pending = asyncio.create_task(connect(sess, service=99))
        while not hooks.requests:
            await asyncio.sleep(0.001)
        await srv.stop()
        with pytest.raises(ControlError):
            await pending
        assert sess.closed
    finally:
        await cli.close()
        await srv.stop()


async def test_lost_sessions_are_reported_and_local_closes_are_not(hooks: Hooks) -> None:
    """Either end hears when the other end's doing (or the network's) ends a session, so it
    can check the peer; its own close or stop says nothing.  A reconnect to an address
    where nothing listens is ``no_listener``, and PONG and ACCEPT carry the instance."""
    srv = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0))
    await srv.start()
    lost: list[tuple[str, str]] = []
    cli = ControlClient("h0", psk("h0"), on_lost=lambda peer, why: lost.append((peer, why)))
    try:
        sess = await cli.open_session(SERVER, srv.address)
        assert await sess.instance() == hooks.instance
        await sess.close()  # ours: the client is not told; the server is
        while not hooks.lost:
            await asyncio.sleep(0.001)
        assert hooks.lost == [("h0", "eof")] and lost == []
        sess = await cli.open_session(SERVER, srv.address)
        await sess.ping()
        address = srv.address
        await srv.stop()  # the server's stop: its node is not told; the client is
        while not lost:
            await asyncio.sleep(0.001)
        assert lost == [(SERVER, "eof")] and hooks.lost == [("h0", "eof")]
        with pytest.raises(ControlError) as err:
            await cli.open_session(SERVER, address)
        assert err.value.reason == "no_listener"
    finally:
        await cli.close()
        await srv.stop()


@pytest.mark.parametrize("bad", ["XYZ", "0" * 33, 7, "ABCD"])
async def test_a_bad_instance_is_a_bad_request(
    server: ControlServer, client: ControlClient, hooks: Hooks, bad: object
) -> None:
    sess = await session(server, client)
    with pytest.raises(ControlError, match="instance"):
        await sess.request({"type": "CONNECT", "src_host": 0, "src_qpn": 1, "src_psn": 1,
                            "service": 1, "planes": 4, "mtu_payload": 4096,
                            "instance": bad})  # fmt: skip
    assert not hooks.requests  # never reached the node


# Peers without valid credentials ---------------------------------------------------------
async def refused(server: ControlServer, cli: ControlClient, peer: str = SERVER) -> None:
    try:
        with pytest.raises(ControlError) as err:
            await cli.open_session(peer, server.address)
        assert err.value.reason == "refused"
    finally:
        await cli.close()


async def test_wrong_psk(server: ControlServer) -> None:
    await refused(server, ControlClient("h0", psk("h0", bytes(32))))
    assert server.stats.auth_failures == {"bad_mac": 1} and server.stats.sessions == 0
    await still_serves(server)


async def test_unknown_peer_key() -> None:
    keys = {h: generate_keypair() for h in ("h0", "h1", "h2")}
    srv = ControlServer(
        "h1", Credentials.from_keypair("h1", keys["h1"][0], {"h0": keys["h0"][1]}), Hooks(),
        ("::1", 0),
    )  # fmt: skip
    await srv.start()
    try:
        stranger = Credentials.from_keypair("h2", keys["h2"][0], {"h1": keys["h1"][1]})
        await refused(srv, ControlClient("h2", stranger))
        assert srv.stats.auth_failures == {"unknown_peer": 1}
        good = Credentials.from_keypair("h0", keys["h0"][0], {"h1": keys["h1"][1]})
        cli = ControlClient("h0", good)
        try:
            assert await (await cli.open_session("h1", srv.address)).ping() >= 0
        finally:
            await cli.close()
    finally:
        await srv.stop()


async def test_wrong_claimed_host(server: ControlServer) -> None:
    """h0 asks for h2 at h1's address."""
    await refused(server, ControlClient("h0", psk("h0")), peer="h2")
    assert server.stats.auth_failures == {"identity": 1}
    await still_serves(server)


async def test_replayed_handshake(server: ControlServer) -> None:
    _, writer, _, (msg1, _) = await raw_session(server)
    writer.close()
    # Message 1 again: refused before anything is sent.
    assert await send_raw(server, encode_frame(msg1)) == b""
    assert server.stats.auth_failures == {"replay": 1}
    await still_serves(server)


async def test_replayed_handshake_to_a_restarted_server(hooks: Hooks) -> None:
    """A new server process has an empty replay cache: the replayed message 1 gets a fresh
    message 2, and the recorded message 3 cannot confirm it."""
    first = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0))
    await first.start()
    try:
        _, writer, _, (msg1, msg3) = await raw_session(first)
        writer.close()
    finally:
        await first.stop()
    second = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0))
    await second.start()
    try:
        reader, writer = await asyncio.open_connection(*second.address)
        writer.write(encode_frame(msg1))
        assert await read_frame(reader, 256) is not None
        writer.write(encode_frame(msg3))
        assert await closed_by_server(reader) == b""
        writer.close()
        assert second.stats.auth_failures == {"bad_mac": 1} and second.stats.sessions == 0
        await still_serves(second)
    finally:
        await second.stop()


# Garbage and slow peers ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: mrcd\r\n\r\n", "oversized"),
        (b"\xff\xff\xff\xff", "oversized"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "oversized"),
        (encode_frame(b"\x00" * 100), "malformed"),
        (encode_frame(os.urandom(100)), "malformed"),
        (encode_frame(b""), "malformed"),
        (b"\x00\x00\x00\x64" + b"MRCC" * 4, "truncated"),
        (b"\x00\x00", "truncated"),
        (b"", "eof"),
    ],
)
async def test_garbage_gets_nothing(
    server: ControlServer, data: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mrcd.control"):
        assert await send_raw(server, data) == b""
    assert server.stats.rejected == {reason: 1}
    assert len([r for r in caplog.records if r.name == "mrcd.control"]) == 1
    await still_serves(server)


async def test_slowloris_handshake_times_out(server: ControlServer) -> None:
    assert await send_raw(server, b"\x00\x00\x00\x50MRCC", finish=False) == b""
    assert server.stats.rejected == {"timeout": 1}
    await still_serves(server)


BUSY_FRAME = encode_frame(encode_busy(BUSY_RETRY_AFTER))


async def test_too_many_handshakes_at_once(hooks: Hooks) -> None:
    """Past the limit a peer gets the busy frame, and nothing else."""
    srv = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0), max_handshakes=1)
    await srv.start()
    try:
        _, idle = await asyncio.open_connection(*srv.address)
        while srv.stats.connections < 1:
            await asyncio.sleep(0.001)
        assert await send_raw(srv, b"") == BUSY_FRAME
        assert srv.stats.rejected == {"busy": 1}
        idle.close()
        while srv.stats.rejected.get("eof", 0) < 1:
            await asyncio.sleep(0.001)
        await still_serves(srv)
    finally:
        await srv.stop()


def test_admission_keeps_room_per_source_and_for_new_sources() -> None:
    def admit(total: int, from_source: int) -> str | None:
        return admission(total, from_source, limit=10, per_source=3, reserve=4)

    assert admit(0, 0) is None and admit(5, 2) is None
    assert admit(1, 3) == "source_busy"  # a source at its share, however empty the server
    assert admit(6, 1) == "busy" and admit(6, 0) is None  # the reserve: new sources only
    assert admit(9, 0) is None and admit(10, 0) == "busy"  # the limit holds for everyone


def test_the_busy_frame_carries_only_a_retry_hint() -> None:
    assert decode_busy(encode_busy(0.25)) == 0.25
    assert decode_busy(encode_busy(1e-9)) == 0.001  # at least a millisecond
    assert decode_busy(b"MRCCBUSY") is None and decode_busy(encode_busy(1.0) + b"x") is None
    assert len(encode_busy(1.0)) < MSG2_SIZE  # never taken for a handshake message


async def test_a_connection_that_sends_nothing_is_closed_early(hooks: Hooks) -> None:
    """An idle connection goes at the idle timeout, not the handshake's (it says which)."""
    srv = ControlServer(
        SERVER, psk(SERVER), hooks, ("::1", 0), handshake_timeout=30.0, idle_timeout=0.2
    )
    await srv.start()
    try:
        reader, writer = await asyncio.open_connection(*srv.address)
        assert await asyncio.wait_for(closed_by_server(reader), 10) == b""
        writer.close()
        assert srv.stats.rejected == {"idle": 1}
    finally:
        await srv.stop()


async def hold(port: int, source: str) -> asyncio.StreamWriter:
    """An idle connection to 127.0.0.1:``port`` from loopback address ``source``."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    return writer


async def test_one_source_at_its_share_leaves_room_for_others(hooks: Hooks) -> None:
    """Sources A and B hold idle connections: A up to its share, B into the reserve.  Both
    are then told busy; a new source still gets a session."""
    srv = ControlServer(
        SERVER, psk(SERVER), hooks, ("127.0.0.1", 0), handshake_timeout=30.0,
        idle_timeout=30.0, max_handshakes=4, max_per_source=2, new_source_reserve=1,
    )  # fmt: skip
    await srv.start()
    port = srv.address[1]
    held: list[asyncio.StreamWriter] = []
    try:
        held += [await hold(port, "127.0.0.2") for _ in range(2)]
        held.append(await hold(port, "127.0.0.3"))
        while srv.stats.connections < 3:
            await asyncio.sleep(0.001)

        async def refused(source: str) -> bytes:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
            try:
                return await reader.read()
            finally:
                writer.close()

        assert await refused("127.0.0.2") == BUSY_FRAME  # A: its share
        assert await refused("127.0.0.3") == BUSY_FRAME  # B: the last slot is a new source's
        assert srv.stats.rejected == {"source_busy": 1, "busy": 1}
        await still_serves(srv)  # from 127.0.0.1: new
    finally:
        for w in held:
            w.close()
        await srv.stop()


async def test_a_busy_peer_is_retried_until_it_has_room(hooks: Hooks) -> None:
    """The client says busy (not refused credentials) when its time runs out, and gets
    through once the server has room, within one open_session call."""
    srv = ControlServer(SERVER, psk(SERVER), hooks, ("::1", 0), max_handshakes=1)
    await srv.start()
    cli = ControlClient("h0", psk("h0"))
    try:
        _, idle = await asyncio.open_connection(*srv.address)
        while srv.stats.connections < 1:
            await asyncio.sleep(0.001)
        with pytest.raises(ControlError, match=r"is busy.*still busy after") as info:
            await cli.open_session(SERVER, srv.address, timeout=0.3)
        assert info.value.reason == "busy" and "credentials" not in str(info.value)
        opening = asyncio.create_task(cli.open_session(SERVER, srv.address, timeout=30))
        refused = srv.stats.rejected["busy"]
        while srv.stats.rejected["busy"] == refused:  # it has been told busy once more
            await asyncio.sleep(0.001)
        idle.close()
        sess = await opening
        assert await sess.ping() >= 0
    finally:
        await cli.close()
        await srv.stop()


async def test_a_busy_peer_whose_next_answer_is_late_is_reported_busy() -> None:
    """The time runs out during a retry (the peer, or this host, too slow to answer it):
    the error is still that the peer is busy, not that it cannot be reached."""
    answered: list[int] = []
    held: list[asyncio.StreamWriter] = []

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not answered:
            writer.write(encode_frame(encode_busy(0.05)))  # the first try: busy
            await writer.drain()
        else:
            held.append(writer)  # the next: the handshake is never answered
        answered.append(1)

    fake = await asyncio.start_server(peer, "::1", 0)
    address = fake.sockets[0].getsockname()[:2]
    cli = ControlClient("h0", psk("h0"))
    try:
        with pytest.raises(ControlError) as info:
            await cli.open_session(SERVER, address, timeout=0.5)
        assert len(answered) == 2, answered
        assert info.value.reason == "busy", info.value
        assert "is busy" in str(info.value) and "last one unanswered" in str(info.value)
    finally:
        for w in held:
            w.close()
        fake.close()
        await fake.wait_closed()
        await cli.close()


# Authenticated but hostile ---------------------------------------------------------------
async def test_tampered_record(server: ControlServer) -> None:
    reader, writer, records, _ = await raw_session(server)
    record = bytearray(records.seal({"type": "PING", "id": 1, "ts": 1}))
    record[-20] ^= 0x01
    writer.write(encode_frame(bytes(record)))
    assert await closed_by_server(reader) == b""
    writer.close()
    assert server.stats.rejected == {"decrypt": 1}
    await still_serves(server)


async def test_replayed_and_reordered_records(server: ControlServer) -> None:
    reader, writer, records, _ = await raw_session(server)
    first = records.seal({"type": "PING", "id": 1, "ts": 1})
    writer.write(encode_frame(first))
    reply = await read_frame(reader, 1 << 20)
    assert reply is not None and records.open(reply)["type"] == "PONG"
    writer.write(encode_frame(first))  # replayed
    assert await closed_by_server(reader) == b""
    writer.close()

    reader, writer, records, _ = await raw_session(server, host="h2")
    records.seal({"type": "PING", "id": 1, "ts": 1})  # skipped: the next one is out of order
    writer.write(encode_frame(records.seal({"type": "PING", "id": 2, "ts": 1})))
    assert await closed_by_server(reader) == b""
    writer.close()
    assert server.stats.rejected == {"sequence": 2}
    await still_serves(server)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"[" * 60000, "bad_message"),  # nesting bomb
        (b"\xff\xfe", "bad_message"),
        (b"[1, 2]", "bad_message"),
        (b'{"type": "PING", "id": NaN}', "bad_message"),
        (b'{"type": "PING", "id": true}', "bad_message"),
    ],
)
async def test_bad_plaintext(server: ControlServer, payload: bytes, reason: str) -> None:
    reader, writer, records, _ = await raw_session(server)
    writer.write(encode_frame(records.seal_bytes(payload)))
    assert await closed_by_server(reader) == b""
    writer.close()
    assert server.stats.rejected == {reason: 1}
    await still_serves(server)


async def test_oversized_frame_after_auth(server: ControlServer) -> None:
    reader, writer, records, _ = await raw_session(server)
    writer.write((records.frame_limit + 1).to_bytes(4, "big"))
    assert await closed_by_server(reader) == b""
    writer.close()
    assert server.stats.rejected == {"oversized": 1}
    await still_serves(server)


def test_reflected_record_does_not_decrypt() -> None:
    init, resp = Initiator(psk("h0"), "h1"), Responder(psk("h1"))
    msg2 = resp.receive(init.start())
    assert msg2 is not None
    msg3 = init.receive(msg2)
    assert msg3 is not None
    resp.receive(msg3)
    a, b = RecordLayer(init.result), RecordLayer(resp.result)
    record = a.seal({"type": "PING", "id": 1, "ts": 0})
    with pytest.raises(ControlError) as err:
        a.open(record)  # sent back to its author
    assert err.value.reason == "decrypt"
    assert b.open(record)["type"] == "PING"


def test_rejection_logs_are_rate_limited() -> None:
    limit = LogLimit(burst=3, window=1.0)
    assert [limit.allow(10.0 + i * 0.01) for i in range(5)] == [0, 0, 0, None, None]
    assert limit.allow(11.5) == 2  # next window: reports what was held back
    assert limit.allow(11.6) == 0


async def test_flood_of_garbage_connections(server: ControlServer) -> None:
    rng = random.Random(4)
    payloads = [rng.randbytes(rng.randrange(0, 400)) for _ in range(200)]
    payloads += [encode_frame(rng.randbytes(rng.randrange(0, 256))) for _ in range(100)]
    replies = await asyncio.gather(*(send_raw(server, p) for p in payloads))
    assert set(replies) <= {b"", BUSY_FRAME}  # at most told to come back later
    assert sum(server.stats.rejected.values()) == len(payloads)
    assert not server.stats.auth_failures  # junk fails the handshake, not authentication
    assert server.stats.sessions == 0
    await still_serves(server)
