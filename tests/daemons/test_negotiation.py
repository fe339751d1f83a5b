"""mrcstack's extension headers between mrcds: on by default and a QP refused with a
one-line reason when the versions differ (two mrcds in loopback data mode with their real
control channel).  A QP without the extension needs a fabric (its EV rides in the UDP source
port): the pair that negotiates down and the QP set up out of band are in
``test_negotiation_live.py``."""

from __future__ import annotations

import os

import pytest

from mrcstack.api import ApiError, WriteWr
from mrcstack.daemons.mrcd.node import connect as node_connect
from tests.support.apiharness import Daemons, End, connect, drain, end

SIZE = 1 << 20


def verified_write(a: End, b: End) -> None:
    """1 MiB with an immediate from a to b; b's memory must hold it."""
    payload = os.urandom(SIZE)
    a.mr.buf[:] = payload
    a.qp.post_send(WriteWr(1, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey, imm=9))
    assert drain(a.cq, 1)[0].ok
    got = drain(b.cq, 1)[0]
    assert got.ok and got.imm == 9
    assert bytes(b.mr.buf) == payload


def test_between_mrcds_the_extension_is_on(daemons: Daemons) -> None:
    a, b = connect(daemons, SIZE)
    a.qp.post_recv(range(4))
    assert a.qp.query().extensions is True and b.qp.query().extensions is True
    verified_write(a, b)
    verified_write(b, a)


def test_the_versions_each_end_offers_decide() -> None:
    """Both with the same version: on; either without: off (negotiated down); different
    versions, or a peer that says nothing: refused, with a one-line reason."""
    negotiate = node_connect.negotiate
    assert negotiate(4, 4, "h3") is True
    assert negotiate(4, 0, "h3") is False and negotiate(0, 4, "h3") is False
    assert negotiate(0, 0, "h3") is False
    for theirs in (3, -1):
        reason = negotiate(4, theirs, "h3")
        assert isinstance(reason, str) and reason.startswith("mrcd on h3 ") and "\n" not in reason


def test_another_version_is_refused_with_a_reason(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        node_connect.ConnectionSetup, "offered", property(lambda self: 3 if self.host else 4)
    )
    a, b = end(daemons, 0, SIZE), end(daemons, 3, SIZE)
    b.ctx.listen(7)  # (a listener that never accepts: the refusal comes before it)
    with pytest.raises(ApiError) as err:
        a.qp.connect(3, 7, timeout=10)
    assert "speaks mrcstack extension version" in str(err.value)
    assert "\n" not in str(err.value)


def ack_delays(daemons: Daemons, a: End, b: End) -> tuple[object, object]:
    """Each QP's ACK delay as ``mrcctl qp show`` reports it (h0's, h3's)."""

    def read(host: int, qpn: int) -> object:
        (info,) = daemons.nodes[host].table.qp_info(qpn)
        return info["ack_delay"]

    return daemons.on_loop(lambda: (read(0, a.qp.qpn), read(3, b.qp.qpn)))


def test_between_mrcds_acks_are_delayed(daemons: Daemons) -> None:
    """Both ends say their senders flag a full window: each delays its ACKs as configured."""
    a, b = connect(daemons, SIZE)
    configured = daemons.nodes[0].cfg.ack_delay
    assert configured > 0 and ack_delays(daemons, a, b) == (configured, configured)
    verified_write(a, b)


@pytest.mark.parametrize("old", [0, 3])
def test_acks_to_an_mrcd_that_does_not_flag_a_full_window_are_not_delayed(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch, old: int
) -> None:
    """An mrcd from before the window-full ACK_REQ says nothing of it (the field is absent
    from its CONNECT, or from its ACCEPT): ACKs to it go at once, else each of its windows
    would wait out the delay; its own ACKs to us may still wait."""
    monkeypatch.setattr(
        node_connect.ConnectionSetup, "window_ack_req", property(lambda self: self.host != old)
    )
    a, b = connect(daemons, SIZE)
    configured = daemons.nodes[0].cfg.ack_delay
    expected = (configured, 0.0) if old == 0 else (0.0, configured)
    assert ack_delays(daemons, a, b) == expected
    a.qp.post_recv(range(4))
    verified_write(a, b)
    verified_write(b, a)


def test_a_qp_set_up_out_of_band_never_delays_its_acks(daemons: Daemons) -> None:
    """Nothing tells such a QP whether its peer flags a full window (it may be a NIC that
    speaks only OCP MRC 1.0): its ACKs go at once, even between two mrcds."""
    a, b = end(daemons, 0, SIZE), end(daemons, 3, SIZE)
    a.qp.post_recv(range(4))
    b.qp.post_recv(range(4))
    a_psn, b_psn = a.qp.query().psn, b.qp.query().psn
    a.qp.connect_manual(3, b.qp.qpn, b_psn, extensions=True)
    b.qp.connect_manual(0, a.qp.qpn, a_psn, extensions=True)
    assert ack_delays(daemons, a, b) == (0.0, 0.0)
    verified_write(a, b)
    verified_write(b, a)
