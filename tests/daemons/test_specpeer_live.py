"""mrcd against a peer that speaks only OCP MRC 1.0, live, both ways, under a link flap.

The peer (``tests/support/specpeer.py``) is built on the Scapy layers alone and imports
nothing of mrcstack's codec or core: it stands in for a NIC without mrcd on host h1, while
mrcd runs on h0 only.  The application on h0 sets its QP up out of band
(``QueuePair.connect_manual``: the peer's host, QPN and first PSN), so the QP runs without
mrcstack's extension.  16 MiB go each way in 1 MiB writes (the last with an immediate)
while one of the source rack's uplinks goes down and comes back; both ends' SHA-256 of what
arrived must equal what was sent, in the uSID and the STEV formats, and the peer's resends
stay within one per packet.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from mrcstack import addrplan
from mrcstack.api import Device, WriteWr
from mrcstack.api.ctl import Controller
from mrcstack.fabric import Fabric
from tests.support import REPO
from tests.support.programs import by_label, samples, scrape
from tests.support.testbeds import Bed, Testbeds

pytestmark = [pytest.mark.requires_root, pytest.mark.timeout(600)]
FABRIC = Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=2)
MRCD, PEER = 0, 1  # h0 runs mrcd, h1 the spec-only peer
MIB = 1 << 20
WRITES = 16  # 16 MiB each way
PEER_VA, PEER_RKEY = 0x7F00_0000_0000, 0x5EC0_0001
FLAPPED = "p0:t0a-t1a"
WAIT = 240.0


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("sp", FABRIC, cluster=True, hosts=[MRCD])


def peer_config(fmt: str, qpn: int) -> dict[str, Any]:
    """The peer's QP, buffer and, per plane, its address, mrcd's and its EVs' outer
    destinations (uSID: the path's; STEV: mrcd's address, the EV in port and label)."""
    planes = []
    for plane in range(FABRIC.planes):
        routes = []
        for t1 in range(FABRIC.t1_per_plane):
            for entropy in (0x10, 0x20):  # the stripe's source port: EV[31:16]
                ev = addrplan.ev_value(plane, t1, entropy)
                dst = (
                    addrplan.address(FABRIC, PEER, MRCD, plane, ev)
                    if fmt == "srv6"
                    else addrplan.nic_sid(FABRIC, plane, MRCD)
                )
                routes.append({"ev": ev, "dst": str(dst)})
        planes.append({
            "plane": plane, "device": f"nic{plane}", "routes": routes,
            "local": str(addrplan.nic_sid(FABRIC, plane, PEER)),
            "peer": str(addrplan.nic_sid(FABRIC, plane, MRCD)),
        })  # fmt: skip
    return {"qpn": qpn, "psn": 0xFFFC00, "mtu": 8192, "planes": planes,
            "buffer": {"va": PEER_VA, "rkey": PEER_RKEY, "size": WRITES * MIB}}  # fmt: skip


class SpecPeer:
    """The peer process in h1's namespace, spoken to in JSON lines."""

    def __init__(self, bed: Bed, cfg: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", bed.state.ns(f"h{PEER}"), sys.executable,
             str(REPO / "tests" / "support" / "specpeer.py"), json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def tell(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait(self, event: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline():
            msg: dict[str, Any] = json.loads(line)
            if msg["event"] == event:
                return msg
            assert msg["event"] not in ("error",), msg
        raise AssertionError(f"the peer ended: {self.proc.wait()} {self.proc.stderr.read()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def flap(bed: Bed, started: threading.Event) -> None:
    started.wait(WAIT)
    time.sleep(0.2)
    bed.faults.link_down(FLAPPED)
    time.sleep(0.5)
    bed.faults.link_up(FLAPPED)


@pytest.mark.parametrize("fmt", ["srv6", "stev"])
def test_16mib_each_way_with_a_spec_only_peer_under_a_link_flap(bed: Bed, fmt: str) -> None:
    assert bed.cluster is not None
    sock = bed.cluster.daemons[MRCD].api_socket
    with Controller.open(sock) as ctl:  # no QP uses profile 0 between runs
        assert ctl.modify_ev_profile(0, ev_format=fmt)["format"] == fmt
    ctx = Device.open(sock).create_context()
    peer = SpecPeer(bed, peer_config(fmt, 0x00C0DE))
    try:
        cq = ctx.create_cq(4096)
        mr = ctx.reg_mr(WRITES * MIB)
        qp = ctx.create_qp(cq)
        ready = peer.wait("ready")
        my_psn = qp.connect_manual(PEER, ready["qpn"], ready["psn"])
        assert qp.query().extensions is False
        peer.tell(cmd="connect", remote_qpn=qp.qpn, remote_psn=my_psn)
        peer.wait("connected")

        # mrcd -> peer: 16 writes of 1 MiB from the region, the last with an immediate.
        data = random.Random(fmt).randbytes(WRITES * MIB)
        mr.buf[:] = data
        started = threading.Event()
        flapper = threading.Thread(target=flap, args=(bed, started))
        flapper.start()
        try:
            started.set()
            qp.post_send([
                WriteWr(n, (mr, n * MIB, MIB), PEER_VA + n * MIB, PEER_RKEY,
                        imm=0xE0F if n == WRITES - 1 else None)
                for n in range(WRITES)
            ])  # fmt: skip
            imm = peer.wait("imm")
            done = []
            deadline = time.monotonic() + WAIT
            while len(done) < WRITES and time.monotonic() < deadline:
                done += cq.poll_wait(WRITES - len(done), timeout=1.0)
        finally:
            flapper.join(WAIT)
        assert len(done) == WRITES and all(wc.ok for wc in done), done
        assert imm["imm"] == 0xE0F and imm["bytes"] >= WRITES * MIB
        peer.tell(cmd="sha256", offset=0, length=WRITES * MIB)
        got = peer.wait("sha256")
        assert got["sha256"] == hashlib.sha256(data).hexdigest(), got
        assert got["stats"]["icrc_bad"] == 0, got

        # peer -> mrcd: the same amount into the region, under a flap again.
        qp.post_recv([1])
        started = threading.Event()
        flapper = threading.Thread(target=flap, args=(bed, started))
        flapper.start()
        try:
            started.set()
            peer.tell(cmd="write", va=mr.addr, rkey=mr.rkey, size=MIB, count=WRITES,
                      seed=7, imm=0xF00D)  # fmt: skip
            sent = peer.wait("writes_done")
            recv = cq.poll_wait(1, timeout=WAIT)
        finally:
            flapper.join(WAIT)
        assert recv and recv[0].ok and recv[0].imm == 0xF00D, recv
        assert hashlib.sha256(bytes(mr.buf)).hexdigest() == sent["sha256"], sent
        rejected = by_label(bed, MRCD, "mrc_rejected_packets_total")
        print(f"\n{fmt}: peer sent 16 MiB in {sent['seconds']} s, {sent['retransmits']} "
              f"retransmitted; peer stats {got['stats']}; mrcd rejected {rejected}")  # fmt: skip
        # The flap costs tens of resends; a recovery that collapses (every packet timing
        # out again and again) sends tens of thousands.  One per packet lies between, far
        # from both; the peer's timeline and mrcd's counters say what happened.
        assert sent["retransmits"] <= sent["packets"], (
            sent["stats"], sent["timeline"], rejected,
            {k: v for k, v in samples(scrape(bed, MRCD)).items()
             if k[0] in ("mrc_duplicate_packets_total", "mrc_received_packets_total")},
        )  # fmt: skip
        qp.destroy()
    finally:
        peer.tell(cmd="quit")
        peer.close()
        ctx.close()
