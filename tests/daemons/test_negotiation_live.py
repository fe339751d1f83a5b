"""QPs without mrcstack's extension between two live mrcds: set up out of band (each
application hands its mrcd the peer's host, QPN and first PSN, as ``ibv_modify_qp`` takes
them), and negotiated down with an mrcd that has the extension off.  Every QP moves 4 MiB
each way, verified, on a testbed (their EVs ride in the UDP source port and flow label).
"""

from __future__ import annotations

import os

import pytest

from mrcstack.api import WriteWr
from mrcstack.fabric import Fabric
from tests.support.programs import End, closing, connect, drain, open_end
from tests.support.testbeds import Bed, Testbeds

pytestmark = pytest.mark.requires_root
FABRIC = Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=2)
SIZE = 4 << 20


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("ng", FABRIC, cluster=True)


def verified_write(a: End, b: End, qa: int, imm: int) -> None:
    payload = os.urandom(SIZE)
    a.mr.buf[:] = payload
    a.qps[qa].post_send(WriteWr(imm, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey, imm=imm))
    assert drain(a.cq, 1)[0].ok
    got = drain(b.cq, 1)[0]
    assert got.ok and got.imm == imm
    assert bytes(b.mr.buf) == payload


def test_a_qp_set_up_out_of_band_runs_without_the_extension(bed: Bed) -> None:
    a, b = open_end(bed, 0, SIZE), open_end(bed, 1, SIZE)
    with closing(a, b):
        qa, qb = a.ctx.create_qp(a.cq), b.ctx.create_qp(b.cq)
        a.qps.append(qa)
        b.qps.append(qb)
        qa.post_recv(range(4))
        qb.post_recv(range(4))
        a_psn, b_psn = qa.query().psn, qb.query().psn  # what each end tells the other
        assert qa.connect_manual(1, qb.qpn, b_psn) == a_psn
        assert qb.connect_manual(0, qa.qpn, a_psn) == b_psn
        assert qa.query().extensions is False and qb.query().extensions is False
        verified_write(a, b, 0, 1)
        verified_write(b, a, 0, 2)


def test_an_mrcd_without_the_extension_negotiates_it_down(bed: Bed) -> None:
    """h1 restarted with ``extensions = false`` (and so no AES-GCM); h0 as shipped."""
    cluster = bed.cluster
    assert cluster is not None
    cfg = cluster.daemons[1].config
    shipped = cfg.read_text()
    cfg.write_text(
        shipped.replace("[mrcd]\n", "[mrcd]\nextensions = false\npacket_auth = false\n", 1)
    )
    cluster.kill(1)
    cluster.restart(1)
    try:
        a, b = open_end(bed, 0, SIZE), open_end(bed, 1, SIZE)
        with closing(a, b):
            qa, qb = connect(a, b, 1, recvs=4)
            qa.post_recv(range(4))
            assert qa.query().extensions is False and qb.query().extensions is False
            verified_write(a, b, 0, 3)
            verified_write(b, a, 0, 4)
    finally:
        cfg.write_text(shipped)
        cluster.kill(1)
        cluster.restart(1)
