"""The fault harness without a testbed (:mod:`mrcstack.netns.faults.harness`): a planned,
never built testbed and stand-ins for ``ip`` and ``tc`` show what is refused up front, what
a failing undo leaves, and how a missing trim program or kernel feature is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mrcstack.fabric import Fabric
from mrcstack.netns import testbed, trim
from mrcstack.netns.faults import ops as faultops
from mrcstack.netns.faults.harness import Faults
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.faults.records import Fault, FaultKind, Settle, Tier, TrimDetach, locked_records
from mrcstack.netns.run import TestbedError
from mrcstack.netns.topology import plan
from tests.support.faketools import FakeTools

FABRIC = Fabric()


def test_a_half_built_testbed_is_refused() -> None:
    with pytest.raises(FaultError, match="not completely built"):
        Faults(plan(FABRIC, "tc").state())


UNBUILT = "tu"  # a testbed that is planned, never built: its namespaces do not exist


def test_restore_all_goes_on_past_a_failing_trim_detach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trim whose detach fails (its namespace is gone) is reported, forgotten, and does
    not stop restore_all from undoing the fault recorded before it."""
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    detach = TrimDetach(f"{UNBUILT}-gone", "h2", Tier.HOST)
    with locked_records(UNBUILT) as records:
        records.faults = [
            Fault(1, FaultKind.SHAPE, "shape a", "a", {}, (), (Settle(()),)),
            Fault(2, FaultKind.TRIM, "trim b", "b", {}, (), (detach,)),
        ]
        records.next_id = 3
    lines: list[str] = []
    faults = Faults(plan(FABRIC, UNBUILT).state(complete=True), log=lines.append)
    with pytest.raises(FaultError, match=r"1 fault\(s\) not undone: #2: restore #2 trim b") as info:
        faults.restore_all()
    assert f"{UNBUILT}-gone" in str(info.value) and "\n" not in str(info.value)
    assert faults.active() == []
    assert [line.split("] ", 1)[1].split(":")[0] for line in lines] == [
        "restore #2 trim b", "restore #1 shape a"
    ]  # fmt: skip
    assert "FAILED" in lines[0] and "FAILED" not in lines[1]


@pytest.mark.requires_kernel("tc_bpf")
def test_a_trim_that_fails_to_attach_is_undone_and_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply fails (no such namespace), so does the undo's detach: the error reported is
    the attach's, and the fault is not left in the record."""
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    lines: list[str] = []
    faults = Faults(plan(FABRIC, UNBUILT).state(complete=True), log=lines.append)
    with pytest.raises(trim.TrimError, match=f"tc -n {UNBUILT}-p0-t0b -j qdisc show dev h2 root"):
        faults.trim("p0:h2-t0b", None, threshold_bytes=65536, ecn_threshold_bytes=None,
                    rate_bps=1e9)  # fmt: skip
    assert faults.active() == []
    assert len(lines) == 1 and "restore #1 trim p0:h2-t0b p0-t0b>h2" in lines[0]
    assert "FAILED" in lines[0]


def test_up_front_checks_come_before_anything_is_recorded_or_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nft: loss and blackhole say so; no tc: trim says so; an unshaped link without a
    rate: trim says so.  One line each, and nothing ran, was recorded or logged."""
    tools = FakeTools(tmp_path, monkeypatch)  # PATH: a fake ip and tc, no nft
    (tools.bin / "tc").unlink()
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path / "state")
    lines: list[str] = []
    faults = Faults(plan(FABRIC, UNBUILT).state(complete=True), log=lines.append)
    no_nft = r"^`nft` not found: install nftables \(loss and blackhole faults use it\)$"
    for apply in (
        lambda: faults.loss("p0:t0a-t1a", None, 0.1),
        lambda: faults.loss_path("p0-t1a", 0.1),
        lambda: faults.switch_blackhole("p0-t1a"),
    ):
        with pytest.raises(FaultError, match=no_nft):
            apply()
    with pytest.raises(FaultError, match=r"^trim: `tc` not found: install iproute2$"):
        faults.trim("p0:h2-t0b", None, threshold_bytes=65536, ecn_threshold_bytes=None,
                    rate_bps=1e9)  # fmt: skip
    with pytest.raises(FaultError, match=r"^trim p0:h2-t0b: the link is unshaped"):
        faults.trim("p0:h2-t0b", None, threshold_bytes=65536, ecn_threshold_bytes=None)
    assert faults.active() == [] and lines == [] and tools.calls() == []


def test_a_missing_or_stale_trim_program_without_clang_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeTools(tmp_path, monkeypatch)  # PATH without clang
    obj = tmp_path / "trim.o"
    problem = faultops.trim_object_problem(obj)
    assert problem == (f"the compiled trim program {obj} is missing and cannot be built: "
                       "clang not found: apt-get install -y clang libbpf-dev")  # fmt: skip
    obj.write_bytes(b"\x7fELF")
    assert faultops.trim_object_problem(obj) is None  # built after trim.c: usable as is
    os.utime(obj, (0, 0))
    assert "is out of date and cannot be built" in str(faultops.trim_object_problem(obj))


@pytest.mark.parametrize(
    ("fail_on", "reason"),
    [
        ("clsact", "kernel lacks the clsact qdisc (CONFIG_NET_SCH_INGRESS)"),
        ("egress bpf da obj", "cannot load the trim program with cls_bpf (CONFIG_NET_CLS_BPF"),
        ("handle 1: htb", "kernel lacks the htb qdisc (CONFIG_NET_SCH_HTB)"),
    ],
)
def test_the_trim_kernel_probe_names_what_the_kernel_lacks(
    fail_on: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = FakeTools(tmp_path, monkeypatch)
    tools.fail(fail_on, "Error: Specified qdisc kind is unknown.")
    with pytest.raises(TestbedError) as info, testbed.probe_namespace(UNBUILT) as ns:
        faultops.probe_trim_kernel(ns, tmp_path / "trim.o")
    assert reason in str(info.value) and "\n" not in str(info.value)
    add, *probes, delete = tools.calls()
    assert (add, delete) == (f"ip netns add {UNBUILT}-probe", f"ip netns del {UNBUILT}-probe")
    assert fail_on in probes[-1]  # stops at the first thing missing
    assert probes[0] == f"ip -n {UNBUILT}-probe link add v0 type veth peer name v1"
