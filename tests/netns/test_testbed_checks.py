"""The testbed's checks without root or a kernel feature: feature detection against fake
`ip` and `tc` (each missing feature named in one line), `down`/`clean` of the state files
by exact name, and the payload header the live tests parse.  The live tests are in
tests/netns/test_testbed.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.run import TestbedError
from mrcstack.netns.state import (
    faults_log_path,
    faults_path,
    save,
    state_path,
)
from mrcstack.netns.topology import plan
from mrcstack.netns.traffic import (
    HEADER,
)
from tests.support.faketools import GOOD_ROUTE, FakeTools

GARBAGE = 'Error: either "to" is duplicate, or "flavors" is a garbage.'
FEATURES = {  # case: (fail on, its stderr, environment, the one-line reason expected)
    "no ifb": ("type ifb", "Error: Unknown device type.", {},
               "kernel lacks ifb devices (CONFIG_IFB): Error: Unknown device type."),
    "no veth": ("type veth", "Error: Unknown device type.", {}, "kernel lacks veth pairs"),
    "no bridge": ("type bridge", "Error: Unknown device type.", {}, "kernel lacks bridges"),
    "old ip": ("", "", {"FAKE_IP_VERSION": "ip utility, iproute2-5.10.0"},
               "iproute2 5.10: `ip` does not know seg6local flavors next-csid "
               "(needs iproute2 >= 6.1)"),
    "dated ip": ("", "", {"FAKE_IP_VERSION": "ip utility, iproute2-ss190107"},
                 "iproute2-ss190107: `ip` does not know"),
    "ip without the keyword": ("flavors next-csid", GARBAGE, {"FAKE_IP_VERSION": "ip utility"},
                               f"needs iproute2 >= 6.1): {GARBAGE}"),
    "kernel refuses": ("flavors next-csid", "Error: lwt encapsulation type not supported.", {},
                       "kernel lacks SRv6 NEXT-C-SID (needs Linux >= 6.1 with "
                       "CONFIG_IPV6_SEG6_LWTUNNEL): Error: lwt encapsulation type"),
    "kernel drops the flavour": ("", "", {"FAKE_ROUTE": GOOD_ROUTE.replace("flavors next-csid "
                                 "lblen 32 nflen 16 ", "")}, "kernel lacks SRv6 NEXT-C-SID"),
    "no tbf": ("root tbf", "Error: Specified qdisc kind is unknown.", {},
               "kernel lacks the tbf qdisc (CONFIG_NET_SCH_TBF)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FEATURES))
def test_feature_detection_names_what_is_missing_in_one_line(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_on, stderr, env, reason = FEATURES[case]
    tools = FakeTools(tmp_path, monkeypatch)
    tools.fail(fail_on, stderr)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(TestbedError) as info:
        testbed.check_features("tq", shaping=True)
    assert reason in str(info.value) and "\n" not in str(info.value)
    calls = tools.calls()
    if "ip netns add tq-probe" in calls:  # the throwaway namespace never outlives the check
        assert calls[-1] == "ip netns del tq-probe"


def test_feature_detection_passes_and_probes_in_a_throwaway_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = FakeTools(tmp_path, monkeypatch)
    testbed.check_features("tq", shaping=True)
    calls = tools.calls()
    assert calls[:2] == ["ip -V", "ip netns add tq-probe"] and calls[-1] == "ip netns del tq-probe"
    assert any("seg6local action End flavors next-csid" in c for c in calls)
    assert any(c.startswith("tc -n tq-probe qdisc replace dev v0 root tbf") for c in calls)
    testbed.check_features("tq")
    assert not any(c.startswith("tc") for c in tools.calls()[len(calls) :])  # unshaped: no tc


@pytest.mark.parametrize(
    ("missing", "shaping", "reason"),
    [
        ("ip", False, "`ip` not found: install iproute2"),
        ("tc", True, "`tc` not found: install iproute2"),
        ("root", False, "must run as root"),
    ],
)
def test_feature_detection_needs_root_ip_and_tc(
    missing: str, shaping: bool, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = FakeTools(tmp_path, monkeypatch)
    if missing == "root":
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    else:
        (tools.bin / missing).unlink()
    with pytest.raises(TestbedError, match=reason):
        testbed.check_features("tq", shaping=shaping)
    assert tools.calls() == []  # said before anything ran


@pytest.mark.parametrize("command", ["down", "clean"])
def test_down_and_clean_remove_the_fault_record_and_log_by_exact_name(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of testbed ``tq`` exists in the kernel, so this needs no root: only its
    files in the state directory go, not those of ``tq2`` or anything else."""
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    save(plan(Fabric(planes=1), "tq").state())
    mine = [state_path("tq"), faults_path("tq"), faults_log_path("tq")]
    others = [faults_log_path("tq2"), faults_path("tq2"), tmp_path / "tq.log"]
    for file in [*mine[1:], *others]:
        file.write_text("x\n")
    getattr(testbed, command)("tq")
    assert [p for p in mine if p.exists()] == []
    assert [p for p in others if p.exists()] == others


def test_payload_header_is_what_receivers_parse() -> None:
    """The tests above read the stream id at bytes 4..8 of our payload header."""
    assert HEADER.format == "!4sIQ"
