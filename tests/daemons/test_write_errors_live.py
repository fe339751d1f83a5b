"""RDMA semantics after an error, live: mrcd on a two-rack testbed, programs on h0 and h3
using the application API, writes sprayed over every path of every plane.

- A write whose last packet runs past the end of the remote region places no byte; its
  sender gets REM_ACCESS_ERR with its own wr_id.
- Writes posted behind a refused one complete WR_FLUSH_ERR and provably did not land (the
  whole remote region is read back); the receiving program is told its QP failed, and why.
- In a batch of a good write, a bad one and a good one, the first completes successfully,
  the second fails, the third is flushed: in 10 runs out of 10, and every error text names
  the application's wr_id (the completion, the QP's failure, mrcd's log).

The order in which a write's packets arrive is the fabric's; every order is checked in the
core's tests (tests/core/test_write_errors.py), where it can be forced.
"""

from __future__ import annotations

import os

import pytest

from mrcstack.api import AsyncEventType, QpState, WcStatus, WriteWr
from mrcstack.fabric import Fabric
from tests.support.programs import End, async_events, closing, connect, drain, open_end
from tests.support.testbeds import Bed, Testbeds

SRC, DST = 0, 3  # different racks
MIB = 1 << 20
PACKET = 8192  # mrcd's payload per packet (QpAttrs.mtu_payload)
pytestmark = pytest.mark.requires_root


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("we", Fabric(), cluster=True, hosts=[SRC, DST])


def ends(bed: Bed) -> tuple[End, End]:
    a, b = open_end(bed, SRC, MIB), open_end(bed, DST, MIB)
    connect(a, b, DST)
    return a, b


def test_a_write_past_the_end_lands_nothing_and_later_writes_are_flushed(bed: Bed) -> None:
    a, b = ends(bed)
    with closing(a, b):
        a.mr.buf[:] = os.urandom(MIB)
        bad = 0xABCD0001
        # 8 packets, the last one wholly past the end of the 1 MiB region, and four writes
        # behind it in the same batch.
        a.qp.post_send(
            [WriteWr(bad, (a.mr, 0, 8 * PACKET), b.mr.addr + MIB - 7 * PACKET, b.mr.rkey)]
            + [WriteWr(0x100 + i, (a.mr, 0, 4096), b.mr.addr + i * 4096, b.mr.rkey)
               for i in range(4)]
        )  # fmt: skip
        done = {wc.wr_id: wc.status for wc in drain(a.cq, 5)}
        assert done == {bad: WcStatus.REM_ACCESS_ERR,
                        **{0x100 + i: WcStatus.WR_FLUSH_ERR for i in range(4)}}  # fmt: skip
        assert bytes(b.mr.buf) == bytes(MIB)  # not a byte of any of them
        failure = a.qp.query().failure
        assert f"(wr_id {bad:#x})" in failure and "remote access error" in failure, failure
        told = [e for e in async_events(b, wait=2.0) if e.type is AsyncEventType.QP_FATAL]
        assert told and "refused the peer's write of 65536 bytes" in told[0].reason, told
        assert b.qp.query().state is QpState.ERROR


@pytest.mark.parametrize("run", range(10))
def test_the_error_goes_to_the_write_that_caused_it(bed: Bed, run: int) -> None:
    a, b = ends(bed)
    with closing(a, b):
        payload = os.urandom(16 * 1024)
        a.mr.buf[: len(payload)] = payload
        good, bad, flushed = 0xABCD0000 + 3 * run, 0xABCD0001 + 3 * run, 0xABCD0002 + 3 * run
        a.qp.post_send([  # one batch
            WriteWr(good, (a.mr, 0, len(payload)), b.mr.addr, b.mr.rkey),
            WriteWr(bad, (a.mr, 0, 4 * PACKET), b.mr.addr, b.mr.rkey ^ 0x5A5A),
            WriteWr(flushed, (a.mr, 0, 4096), b.mr.addr + MIB // 2, b.mr.rkey),
        ])  # fmt: skip
        wcs = drain(a.cq, 3)
        assert [(wc.wr_id, wc.status) for wc in wcs] == [
            (good, WcStatus.SUCCESS),
            (bad, WcStatus.REM_ACCESS_ERR),
            (flushed, WcStatus.WR_FLUSH_ERR),
        ]
        assert bytes(b.mr.buf[: len(payload)]) == payload  # the good write, intact
        assert bytes(b.mr.buf[len(payload) :]) == bytes(MIB - len(payload))
        failure = a.qp.query().failure
        assert f"(wr_id {bad:#x})" in failure, failure
        log = bed.cluster.daemons[SRC].log.read_text()  # type: ignore[union-attr]
        assert f"(wr_id {bad:#x})" in log
