"""Connection configuration is checked up front, and a valid connection takes any input.

A bad ``ConnectionConfig`` raises :class:`ConfigError` (a ``LocalError``) naming the field,
instead of failing later inside ``receive_datagram``; and whatever arrives from the network,
a valid connection either handles it or raises one of mrcstack's typed errors.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.evs import EvEntry
from mrcstack.core.memory import MemoryTable
from mrcstack.errors import ConfigError, LocalError, MrcError
from mrcstack.wire import (
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataPacket,
    FeedbackFlags,
    Integrity,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    encode,
    encode_plain,
)
from tests.support.wire import any_packet

LOCAL, REMOTE = 5, 6
KEY = bytes(range(16))


def evs(planes: int, per_plane: int) -> tuple[EvEntry, ...]:
    return tuple(EvEntry(p << 8 | i, p) for p in range(planes) for i in range(per_plane))


def config(**kw: object) -> ConnectionConfig:
    fields: dict[str, object] = {"local_qpn": LOCAL, "remote_qpn": REMOTE, "planes": 2}
    fields.update(kw)
    fields.setdefault("evs", evs(int(fields["planes"]), 2))  # type: ignore[call-overload]
    return ConnectionConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field,value",
    [
        ("reverse_evs_per_plane", 0),
        ("probe_ok_needed", 0),
        ("probe_lost_needed", 0),
        ("probe_interval", 0.0),
        ("probe_interval", float("nan")),
        ("skip_rtts", -1.0),
        ("skip_rtts", float("inf")),
        ("timeout", float("nan")),
        ("max_rto", float("inf")),
        ("ev_count", 0),
        ("ev_min_active", -1),
        ("planes", 17),
        ("profile_id", -1),
        ("ack_coalesce", 65),
        ("ack_delay", -1e-6),
        ("ack_delay", float("nan")),
        ("ack_delay", 100e-6),  # over a quarter of the default 200 us timeout
        ("mode", "tcp"),
        ("evs", ()),
        ("evs", (EvEntry(1, 0), EvEntry(1, 1))),
        ("evs", (EvEntry(1, 2),)),
        ("evs", (EvEntry(1 << 32, 0),)),
    ],
)
def test_bad_fields_raise_a_local_config_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"ConnectionConfig.{field}") as err:
        config(**{field: value})
    assert isinstance(err.value, LocalError) and isinstance(err.value, ValueError)


def test_zero_reverse_evs_used_to_crash_on_the_first_data_packet() -> None:
    """The audit's case: reverse_evs_per_plane=0 was accepted, then the first data packet
    divided by zero inside receive_datagram.  Now the configuration itself is refused."""
    with pytest.raises(ConfigError, match="reverse_evs_per_plane"):
        config(reverse_evs_per_plane=0)


def _peer_integrity(keyed: bool) -> Integrity:
    if keyed:
        return AeadIntegrity(KEY, REMOTE, LOCAL)
    return CrcIntegrity()


#: Packets aimed at the connection: its QPN, PSNs near its own, EVs from its set.
aimed = st.tuples(
    any_packet,
    st.booleans() | st.just(True),
    st.integers(0, 300),
    st.sampled_from([0x000, 0x001, 0x100, 0x101, 0x200]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    planes=st.integers(1, 3),
    per_plane=st.integers(1, 3),
    reverse=st.integers(1, 3),
    mode=st.sampled_from(["mrc", "roce"]),
    ack_coalesce=st.sampled_from([1, 4]),
    keyed=st.booleans(),
    plain=st.booleans(),
    post=st.booleans(),
    inputs=st.lists(
        st.tuples(
            aimed | st.binary(max_size=120),
            st.integers(0, 9),  # the arrival port: 8 and 9 are out of range
            st.booleans(),
            st.floats(0.0, 0.01),
        ),
        max_size=25,
    ),
)
def test_receive_datagram_raises_nothing_but_typed_errors(
    planes: int,
    per_plane: int,
    reverse: int,
    mode: str,
    ack_coalesce: int,
    keyed: bool,
    plain: bool,
    post: bool,
    inputs: list[tuple[tuple[Packet, bool, int, int] | bytes, int, bool, float]],
) -> None:
    """The same, without mrcstack's extension too (``plain``: the specification's encoding,
    the EV and traffic class from the outer header)."""
    keyed = keyed and not plain
    memory = MemoryTable()
    region = memory.register(bytearray(4096))
    conn = Connection(
        config(
            planes=planes,
            evs=evs(planes, per_plane),
            reverse_evs_per_plane=reverse,
            mode=mode,
            ack_coalesce=ack_coalesce,
            key=KEY if keyed else None,
            mtu_payload=256,
            extensions=not plain,
        ),
        memory=memory,
        rng=random.Random(1),
        now=0.0,
    )
    now = 0.0
    if post:
        conn.post_write(1, b"p" * 4000, region.va, region.rkey, imm=1, now=now)
    for item, port_pick, ecn, dt in inputs:
        now += dt
        port = {8: -1, 9: planes}.get(port_pick, port_pick % planes)
        if isinstance(item, bytes):
            data = item
        else:
            pkt, ours, psn, ev = item
            if ours and not isinstance(pkt, ProbePacket | ProbeReplyPacket | PortStatusPacket):
                pkt = dataclasses.replace(pkt, qpn=LOCAL)  # past the QPN check
                if isinstance(pkt, DataPacket):
                    pkt = dataclasses.replace(pkt, psn=psn, va=region.va + psn, rkey=region.rkey)
                elif isinstance(pkt, AckPacket):  # about packets this end really sent
                    seq = psn % 20
                    pkt = dataclasses.replace(
                        pkt, ev=ev, echo_ev=ev, cum_psn=(seq - 1) % (1 << 24), echo_psn=seq,
                        sack_base=seq,
                    )  # fmt: skip
                else:
                    pkt = dataclasses.replace(pkt, ev=ev)
            # A fresh sealer each time: tx_seq values repeat, the connection's replay
            # window (not the test's sealer) must deal with that.
            if plain and isinstance(pkt, AckPacket):
                pkt = dataclasses.replace(pkt, flags=pkt.flags & ~FeedbackFlags.DUPLICATE)
            data = (encode_plain if plain else encode)(pkt, _peer_integrity(keyed))
        try:
            conn.receive_datagram(
                data, now=now, port=port, ecn=ecn, ev=ecn * 0x101, tclass=0x30 if dt > 0.009 else 0
            )
            conn.datagrams_to_send(now)
            timer = conn.get_timer()
            if timer is not None and timer <= now:
                conn.handle_timer(now)
        except MrcError:
            pass  # typed: the side is named; anything else fails the test
        while conn.next_event() is not None:
            pass
