"""The shipped Wireshark dissector on a live capture of ``mrc-write-bw`` between racks.

mrcd on a two-rack testbed with ``packet_auth = false`` (OCP MRC 1.0's plain ICRC instead of
mrcstack's AES-GCM extension), tshark capturing in the receiving host's namespace; between
two runs the sender probes a path of each plane through the controller API (EV probes to
the endpoint, QP 2, sealed with the pair's probe key, which the test derives from the
cluster key as the daemons do).  Every captured packet must decode with the codec, its ICRC
verified against the real addresses (with SRv6 uSID, the final destination; a probe's
AES-GCM tag), and
tshark with ``wireshark/mrc.lua`` must print every field the codec reads; writes travel in
the trimmable traffic class (DSCP 4), the rest in the control class (DSCP 46).  Scapy
recomputes the ICRC of each arriving packet that has one from the captured IPv6 header as
a third, independent check.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from mrcstack.addrplan import ev_value, nic_sid
from mrcstack.api.ctl import Controller
from mrcstack.daemons.cluster import Cluster
from mrcstack.daemons.mrcd.config import DATA_PORT
from mrcstack.daemons.mrcd.control.auth import Credentials, load_psk
from mrcstack.fabric import Fabric
from mrcstack.netns.state import TestbedState
from mrcstack.wire import (
    AEAD_TAG_FLAG,
    WRITE_OPCODES,
    XETH_LEN,
    XFETH_LEN,
    AeadIntegrity,
    CrcIntegrity,
    Dscp,
    IcrcPath,
    Opcode,
    decode,
    header_length,
)
from tests.support import dissector
from tests.support.testbeds import Bed, Testbeds
from tests.support.tools import one_json, run_pair, tool

FABRIC = Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=2)
PROBE_OPCODES = (Opcode.ENDPOINT_REQUEST, Opcode.ENDPOINT_RESPONSE)
SRC, DST = 0, 1  # h0 and h1: one per rack
CAPTURE_LIMIT = 4000
pytestmark = [pytest.mark.requires_root, pytest.mark.requires_program("tshark")]


def view(local: int, peer: int) -> CrcIntegrity:
    """The ICRC as host ``local`` checks what ``peer`` sent it."""
    return CrcIntegrity(
        tuple(
            IcrcPath(str(nic_sid(FABRIC, p, local)), str(nic_sid(FABRIC, p, peer)),
                     DATA_PORT, DATA_PORT)
            for p in range(FABRIC.planes)
        )
    )  # fmt: skip


def start_capture(netns: str, pcap: Path) -> subprocess.Popen[str]:
    assert dissector.TSHARK is not None
    cap = subprocess.Popen(
        ["ip", "netns", "exec", netns, dissector.TSHARK, "-n", "-i", "any",
         "-f", f"udp port {DATA_PORT}", "-c", str(CAPTURE_LIMIT), "-a", "duration:90",
         "-w", str(pcap)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert cap.stderr is not None
    for line in cap.stderr:  # tshark says so once the capture is open
        if "Capturing on" in line:
            return cap
    raise AssertionError(f"tshark did not start: {cap.wait()}")


def stop_capture(cap: subprocess.Popen[str]) -> None:
    if cap.poll() is None:
        cap.send_signal(signal.SIGINT)
    try:
        cap.wait(timeout=30)
    except subprocess.TimeoutExpired:
        cap.kill()
        cap.wait()


def sealed(wire: bytes) -> bool:
    """Whether an endpoint packet's extension flags an AES-GCM tag as its trailer."""
    ext = XETH_LEN if wire[0] == Opcode.ENDPOINT_REQUEST else XFETH_LEN
    return bool(wire[header_length(wire[0]) - ext + 1] & AEAD_TAG_FLAG)


def scapy_icrc_ok(pcap: Path, dst: str) -> tuple[int, int]:
    """(arriving packets, those whose ICRC Scapy recomputes to the same value)."""
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    from scapy.contrib.roce import BTH  # noqa: PLC0415
    from scapy.layers.inet6 import IPv6  # noqa: PLC0415
    from scapy.utils import rdpcap  # noqa: PLC0415

    seen = ok = 0
    for frame in rdpcap(str(pcap)):
        if IPv6 not in frame or frame[IPv6].dst != dst or BTH not in frame:
            continue
        if frame[BTH].opcode in PROBE_OPCODES and sealed(bytes(frame[BTH])):
            continue  # an EV probe sealed with the pair's key: an AES-GCM tag, not the ICRC
        ip = IPv6(bytes(frame[IPv6]))
        sent = bytes(ip)[-4:]
        ip[BTH].icrc = None
        seen += 1
        ok += bytes(ip)[-4:] == sent
    return seen, ok


def write_bw(
    cluster: Cluster, state: TestbedState, service: int, count: int
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """``count`` verified 64 KiB writes h0 -> h1 with ``mrc-write-bw`` (server, client)."""
    return run_pair(
        "write_bw",
        tool("write_bw", "--socket", str(cluster.daemons[DST].api_socket),
             "--service", str(service), "--json", netns=state.ns(f"h{DST}")),
        tool("write_bw", "--socket", str(cluster.daemons[SRC].api_socket),
             "--service", str(service), "--server-host", str(DST), "-s", "64KiB",
             "-n", str(count), "--verify", "--json", netns=state.ns(f"h{SRC}")),
    )  # fmt: skip


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("ws", FABRIC, cluster=True, extra="packet_auth = false")


def test_tshark_reads_every_field_of_a_live_write_bw(bed: Bed, tmp_path: Path) -> None:
    state, cluster = bed.state, bed.cluster
    assert cluster is not None
    pcap = tmp_path / "h1.pcap"
    cap = start_capture(state.ns(f"h{DST}"), pcap)
    try:
        pairs = [write_bw(cluster, state, 811, 100)]
        # Between two runs: the capture is surely on by then (the first milliseconds
        # after tshark says it is capturing can miss packets), and the second run's
        # packets are behind them when the capture stops.
        with Controller.open(cluster.daemons[SRC].api_socket) as ctl:
            probes = [ctl.probe(DST, plane, ev_value(plane, plane % FABRIC.t1_per_plane),
                                timeout=5.0) for plane in range(FABRIC.planes)]  # fmt: skip
        pairs.append(write_bw(cluster, state, 812, 100))
    finally:
        stop_capture(cap)
    key = Credentials.from_psk(f"h{SRC}", load_psk(cluster.psk)).probe_key(f"h{DST}")
    assert key is not None
    assert all(r["responses"] and not r["timed_out"] for r in probes), probes
    for srv, cli in pairs:
        assert cli.returncode == 0, cli.stderr
        assert srv.returncode == 0, srv.stderr
        server = one_json(cli.stdout)["server"]
        assert server["mismatches"] == 0 and server["verified"] > 0, server
    rows = dissector.dissect(pcap, extra=("ipv6.src", "ipv6.tclass"))
    from_src = {str(nic_sid(FABRIC, p, SRC)) for p in range(FABRIC.planes)}
    kinds: Counter[str] = Counter()
    for row in rows:
        wire = bytes.fromhex(row["udp.payload"])
        arriving = row["ipv6.src"] in from_src
        local, peer = (DST, SRC) if arriving else (SRC, DST)
        if wire[0] in PROBE_OPCODES and sealed(wire):
            # An EV probe or reply of the endpoint (QP 2) sealed with the pair's probe key,
            # the sender id being the host index + 1 (its extension flags the AES-GCM tag).
            pkt = decode(wire, AeadIntegrity(key, local + 1, peer + 1))  # tag verified
            kinds["sealed EV probes"] += 1
        else:
            pkt = decode(wire, view(local, peer))  # ICRC verified
        assert dissector.mismatches(row, dissector.expected(pkt, wire)) == [], pkt
        kinds[Opcode(wire[0]).name] += 1
        # Writes in the trimmable class, everything else in the control class.
        dscp = Dscp.DATA if wire[0] in WRITE_OPCODES else Dscp.CONTROL
        assert int(row["ipv6.tclass"], 16) >> 2 == dscp, row["ipv6.tclass"]
    print(f"\n{len(rows)} packets dissected: {dict(kinds)}")
    assert kinds["RDMA_WRITE_FIRST"] >= 150  # most of the 200 writes, whole
    assert sum(kinds[Opcode(op).name] for op in WRITE_OPCODES) >= 4 * kinds["RDMA_WRITE_FIRST"]
    for name in ("RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST_IMM", "RELIABILITY_SACK"):
        assert kinds[name] > 0, f"no {name} in the capture: {dict(kinds)}"
    assert kinds["sealed EV probes"] >= 2 * FABRIC.planes  # each probe and its reply
    seen, ok = scapy_icrc_ok(pcap, str(nic_sid(FABRIC, 0, DST)))
    assert seen > 100 and ok == seen, f"Scapy agrees on {ok} of {seen} ICRCs"
    shutil.rmtree(tmp_path, ignore_errors=True)
