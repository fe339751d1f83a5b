"""netem faults on the testbed: the up-front check of the kernel, and (where the kernel has
sch_netem) a live delay.  tests/netns/test_netem_plan.py checks the tc commands they make."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mrcstack.fabric import Fabric
from mrcstack.netns.faults import Faults, netem
from mrcstack.netns.faults.netem import NetemSpec
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.state import load
from tests.support import REPO
from tests.support.testbeds import Testbeds

ROOT = REPO


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> str:
    return testbeds.up("tn", Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=1)).name


def test_the_kernel_is_checked_up_front(bed: str) -> None:
    """Without sch_netem: one line naming it, nothing applied, other faults still work.
    With it: the command succeeds and is recorded."""
    proc = subprocess.run(
        [sys.executable, "-m", "mrcstack", "fault", "--name", bed, "netem", "p0:t0a-t1a",
         "--delay", "5ms"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    faults = Faults(load(bed))
    if netem.netem_problem(bed) is None:
        assert proc.returncode == 0, proc.stderr
        assert [f.kind for f in faults.active()] == ["netem", "netem"]
        faults.restore_all()
        return
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "sch_netem" in proc.stderr
    assert faults.active() == []
    faults.loss("p0:t0a-t1a", None, 0.5)  # a fault that needs no netem
    assert [f.kind for f in faults.active()] == ["loss", "loss"]
    faults.restore_all()


def test_live_delay_and_order_with_shaping(bed: str) -> None:
    if (problem := netem.netem_problem(bed)) is not None:
        pytest.skip(f"this kernel has no sch_netem (the netem qdisc): {problem}")
    state = load(bed)
    faults = Faults(state)
    h0 = state.ns("h0")
    dst = state.baseline["h1"][0]

    def rtt_ms() -> float:
        out = subprocess.run(
            ["ip", "netns", "exec", h0, "ping", "-6", "-c", "5", "-i", "0.2", dst],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        match = re.search(r"= [\d.]+/([\d.]+)/", out)
        assert match is not None, out
        return float(match.group(1))

    base = rtt_ms()
    faults.shape("p0:h0-t0a", None, 100e6)  # shaped first: netem goes under the tbf
    faults.netem("p0:h0-t0a", None, NetemSpec(delay_s=0.020))
    try:
        assert rtt_ms() >= base + 35  # 20 ms each way
        with pytest.raises(FaultError, match="clear"):
            faults.unshape("p0:h0-t0a")  # would take the netem along
    finally:
        faults.restore_all()
    faults.netem("p0:h0-t0a", None, NetemSpec(delay_s=0.010))
    try:
        with pytest.raises(FaultError, match="replace"):
            faults.shape("p0:h0-t0a", None, 100e6)  # would silently replace netem
    finally:
        faults.restore_all()
    assert rtt_ms() < base + 15
