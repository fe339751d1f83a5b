"""The fault harness: pure planning and scenario tests, then every fault against live traffic
on one default testbed (``tc``, as root).

Live checks send UDP datagrams from a host to every path's uSID address (addrplan.paths)
and count, per path, what the destination host receives: a fault must stop exactly the
paths it names, keep the others flowing, and after the undo every path forwards again with
the namespaces' route tables and addresses exactly as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mrcstack.addrplan import Path as FabricPath
from mrcstack.addrplan import paths, switch_locator, switch_usid
from mrcstack.fabric import Fabric
from mrcstack.netns import cli as testbed_cli
from mrcstack.netns import ifctl, testbed, traffic, trim
from mrcstack.netns import run as run_module
from mrcstack.netns.faults import cli as fault_cli
from mrcstack.netns.faults import nftlib
from mrcstack.netns.faults import ops as faultops
from mrcstack.netns.faults.harness import Faults
from mrcstack.netns.faults.plan import (
    FaultError,
    as_replace,
    directions,
    loss_site,
    nft_random_drop,
    nft_ruleset,
    parse_probability,
    path_loss_rule,
    resolve_link,
    resolve_switch,
    routes_avoiding,
    trim_settings,
)
from mrcstack.netns.faults.records import (
    OPERATIONS,
    Address,
    Fault,
    FaultKind,
    NetemAttach,
    NetemDetach,
    Nft,
    NftDelete,
    Operation,
    PortDown,
    PortUp,
    Records,
    Routes,
    Settle,
    Shape,
    Tier,
    TrimAttach,
    TrimDetach,
    Unshape,
    decode_operation,
    load_records,
    locked_records,
    save_records,
)
from mrcstack.netns.faults.scenario import (
    FaultScenarioError,
    parse_scenario,
    parse_time,
    run_scenario,
)
from mrcstack.netns.run import TestbedError, call_in_netns, resident_netns
from mrcstack.netns.state import (
    LinkEnd,
    LinkRecord,
    TestbedState,
    exists,
    faults_log_path,
    faults_path,
    load,
)
from mrcstack.netns.topology import plan
from mrcstack.netns.traffic import DEFAULT_PORT
from mrcstack.wire import (
    DATA_HDR_LEN,
    DATA_IMM_HDR_LEN,
    IMM_OPCODES,
    TCLASS_DATA,
    CrcIntegrity,
    DataPacket,
    Dscp,
    encode,
    encode_trimmed,
    trimmed_length,
)
from tests.support.faketools import FakeTools
from tests.support.isolation import run_name
from tests.support.trimming import CE, ECN_MASK, ECT0, L2_L4, check_trimmed, data_packets, psn_of

REPO = Path(__file__).resolve().parent.parent
FABRIC = Fabric()
#: The live testbed: a name of its own per run, so concurrent runs never share one.
TESTBED = run_name("tc")


# Names ---------------------------------------------------------------------------------------
def test_links_resolve_from_node_names_or_link_names_either_way() -> None:
    assert resolve_link(FABRIC, "p0-t0a", "p0-t1c") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p0-t1c", "p0-t0a") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p0:t1c-t0a") == "p0:t0a-t1c"
    assert resolve_link(FABRIC, "p2-t0b", "h3") == "p2:h3-t0b"
    assert resolve_link(FABRIC, "p1:h0-t0a") == "p1:h0-t0a"


@pytest.mark.parametrize(
    ("a", "b", "problem"),
    [
        ("p0-t0a", "p0-t1z", "not in this fabric"),
        ("h0", "p0-t0b", "not in rack t0b"),
        ("h0", "h1", "both hosts"),
        ("p0-t1a", "p0-t1b", "not a link"),
        ("p0-t0a", "p1-t1a", "not on plane 0"),
        ("p9:t0a-t1a", None, "plane"),
        ("t0a-t1a", None, "bad link name"),
    ],
)
def test_bad_links_are_one_line_errors(a: str, b: str | None, problem: str) -> None:
    with pytest.raises(FaultError, match=problem) as info:
        resolve_link(FABRIC, a, b)
    assert "\n" not in str(info.value)


def test_switches_resolve_from_name_usid_or_locator() -> None:
    assert resolve_switch(FABRIC, "p1-t1c") == "p1-t1c"
    assert resolve_switch(FABRIC, "2102") == "p1-t1c"
    assert resolve_switch(FABRIC, "0x2102") == "p1-t1c"
    assert resolve_switch(FABRIC, "fcbb:bb00:2102::") == "p1-t1c"
    assert resolve_switch(FABRIC, "fcbb:bb00:1001::/48") == "p0-t0b"
    for bad, problem in [
        ("h0", "host"),
        ("p4-t0a", "plane 4"),
        ("p0-t0c", "not in this fabric"),
        ("8001", "host"),
        ("fcbb:bb00:1000:2001::", "names a path"),
        ("fcbb:bb00:1000::/40", "/48"),
        ("fd00:bb00:1000::", "block"),
        ("zz", "bad switch"),
    ]:
        with pytest.raises(FaultError, match=problem):
            resolve_switch(FABRIC, bad)


def test_probabilities_and_directions() -> None:
    assert parse_probability("20%") == pytest.approx(0.2)
    assert parse_probability("0.05") == pytest.approx(0.05)
    assert parse_probability(1) == 1.0
    for bad in ("0", 0.0, "150%", "-0.1", "lots", True):
        with pytest.raises(FaultError):
            parse_probability(bad)
    assert directions("p0:t0a-t1c") == [("p0-t0a", "p0-t1c"), ("p0-t1c", "p0-t0a")]
    assert directions("p0:h0-t0a", "p0-t0a") == [("p0-t0a", "h0")]
    with pytest.raises(FaultError, match="not an end"):
        directions("p0:h0-t0a", "h1")


# nftables rules ------------------------------------------------------------------------------
def test_random_drop_uses_numgen_with_the_asked_probability() -> None:
    assert nft_random_drop(0.2) == "numgen random mod 1000000 < 200000 counter drop"
    assert nft_random_drop(0.000001) == "numgen random mod 1000000 < 1 counter drop"
    assert nft_random_drop(1.0) == "counter drop"
    with pytest.raises(FaultError):
        nft_random_drop(1e-9)  # rounds to zero: refuse rather than silently do nothing


def test_ruleset_is_one_table_with_one_filter_chain() -> None:
    script = nft_ruleset("mrcfault_7", "forward", ['oifname "t1c" counter drop'])
    assert script.splitlines() == [
        "table inet mrcfault_7 {",
        "  chain c_forward {",
        "    type filter hook forward priority -300; policy accept;",
        '    oifname "t1c" counter drop',
        "  }",
        "}",
    ]
    with pytest.raises(ValueError):
        nft_ruleset("t", "output", [])


def _record(name: str, a: tuple[str, str], b: tuple[str, str]) -> LinkRecord:
    return LinkRecord(
        name=name,
        a=LinkEnd(a[0], f"tc-{a[0]}", a[1]),
        b=LinkEnd(b[0], f"tc-{b[0]}", b[1]),
        host_facing=a[0].startswith("h"),
    )


def test_link_loss_sits_at_the_sending_switch_egress_or_the_t0_ingress_for_a_host() -> None:
    fabric_link = _record("p0:t0a-t1c", ("p0-t0a", "t1c"), ("p0-t1c", "t0a"))
    assert loss_site(fabric_link, "p0-t0a") == ("tc-p0-t0a", 'oifname "t1c"')
    assert loss_site(fabric_link, "p0-t1c") == ("tc-p0-t1c", 'oifname "t0a"')
    host_link = _record("p0:h0-t0a", ("h0", "nic0"), ("p0-t0a", "h0"))
    assert loss_site(host_link, "h0") == ("tc-p0-t0a", 'iifname "h0"')
    assert loss_site(host_link, "p0-t0a") == ("tc-p0-t0a", 'oifname "h0"')


def test_path_loss_matches_the_switch_locator_from_the_address_plan() -> None:
    rule = path_loss_rule(FABRIC, "p1-t1c", 0.3)
    locator = switch_locator(FABRIC, switch_usid("p1-t1c"))
    assert rule == f"ip6 daddr {locator} numgen random mod 1000000 < 300000 counter drop"
    assert str(locator) == "fcbb:bb00:2102::/48"


# Route lines ---------------------------------------------------------------------------------
def test_routes_avoiding_down_ports_keep_live_nexthops_only() -> None:
    lines = [
        "route replace fcbb:bb00:2000::/48 via fe80::2 dev t1a",
        "route replace fcbb:bb00:2001::/48 via fe80::2 dev t1b",
        "route replace fdb0:0:0:1::/64 nexthop via fe80::2 dev t1a nexthop via fe80::2 dev t1b",
        "route replace fdb0:0:0:2::/64 nexthop via fe80::2 dev t1a weight 2",
        "route replace fcbb:bb00:1000::/48 encap seg6local action End count dev sid",
    ]
    assert routes_avoiding(lines, {"t1a"}) == [
        "route replace fcbb:bb00:2001::/48 via fe80::2 dev t1b",
        "route replace fdb0:0:0:1::/64 nexthop via fe80::2 dev t1b",
        "route replace fcbb:bb00:1000::/48 encap seg6local action End count dev sid",
    ]
    assert routes_avoiding(lines, set()) == lines
    assert as_replace("route add 1::/64 dev x") == "route replace 1::/64 dev x"
    with pytest.raises(FaultError):
        as_replace("address add fe80::1/64 dev x")


def test_fault_records_round_trip_through_json() -> None:
    fault = Fault(
        id=3,
        kind=FaultKind.LOSS,
        key="loss p0:t0a-t1c p0-t0a>p0-t1c",
        target="p0:t0a-t1c p0-t0a>p0-t1c",
        params={"rate": 0.2},
        holds=(),
        undo=(NftDelete("tc-p0-t0a", "mrcfault_3"),),
        since="2025-01-01T00:00:00.000+00:00",
    )
    assert Fault.from_json(json.loads(json.dumps(fault.to_json()))) == fault
    records = Records("tc", 4, [fault])
    assert records.by_key(fault.key) == fault
    assert records.holder("tc-p0-t0a/t1c") is None
    assert fault.describe() == "#3 loss p0:t0a-t1c p0-t0a>p0-t1c rate=0.2"


#: Fault records as the first version of the harness wrote them (a testbed with every kind
#: of fault; netem's from a kernel with sch_netem).
RECORDS_V1 = Path(__file__).resolve().parent / "netns" / "data"
OPERATION_SAMPLES = (
    PortDown("tc-p0-t0a", "t1a"),
    PortUp("tc-p0-t0a", "t1a", (Address("fe80::1", 64, True), Address("fcbb::1", 128, False))),
    Routes("tc-p0-t0a"),
    Settle((("tc-p0-t0a", "t1a"), ("tc-p0-t1a", "t0a"))),
    Nft("tc-p0-t0a", nft_ruleset("mrcfault_1", "forward", ["counter drop"])),
    NftDelete("tc-p0-t0a", "mrcfault_1"),
    Shape("tc-p0-t0a", "t1a", 50_000_000),
    Shape("tc-p0-t0a", "t1a", 50_000_000, 65536),
    Unshape("tc-p0-t0a", "t1a", Tier.FABRIC),
    TrimAttach("tc-p0-t0a", "h0", 10_000_000, 2000, None, True, 0.01, 8000),
    TrimDetach("tc-p0-t0a", "h0", Tier.HOST),
    NetemAttach("tc-p0-t0a", "t1a", {"delay_s": 0.01, "slot": ["800us"]}),
    NetemDetach("tc-p0-t0a", "t1a"),
)


@pytest.mark.parametrize("name", ["faults-v1-kinds.json", "faults-v1-netem.json"])
def test_records_of_the_first_version_load_as_typed_operations_and_save_unchanged(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    text = (RECORDS_V1 / name).read_text(encoding="utf-8")
    testbed_name = json.loads(text)["testbed"]
    path = faults_path(testbed_name)
    path.write_text(text, encoding="utf-8")
    records = load_records(testbed_name)
    undo = [op for fault in records.faults for op in fault.undo]
    assert all(isinstance(op, Operation) for op in undo)
    if name == "faults-v1-kinds.json":
        assert {f.kind for f in records.faults} == set(FaultKind) - {FaultKind.NETEM}
        assert {type(op) for op in undo} == {PortUp, Routes, Settle, NftDelete, Unshape,
                                             TrimDetach}  # fmt: skip
        [up, *_] = records.faults[0].undo
        assert up == PortUp("nsfxo-p0-t0a", "t1a", (Address("fe80::1", 64, True),))
    else:
        assert {type(op) for op in undo} == {NetemDetach}
    path.unlink()
    save_records(records)
    assert path.read_text(encoding="utf-8") == text


def test_every_operation_kind_has_a_handler_and_round_trips_through_json() -> None:
    kinds = {type(op) for op in OPERATION_SAMPLES}
    assert kinds == set(OPERATIONS.values()) == set(faultops.HANDLERS)
    for op in OPERATION_SAMPLES:
        data = json.loads(json.dumps(op.to_json()))
        assert data["op"] == op.name and OPERATIONS[op.name] is type(op)
        assert decode_operation(data) == op
    assert "queue_bytes" not in OPERATION_SAMPLES[6].to_json()  # the fabric's, as recorded


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ({"kind": "melt"}, "fault #7: unknown kind 'melt'"),
        ({"undo": [{"op": "reboot", "netns": "x"}]}, "fault #7: unknown operation 'reboot'"),
        ({"undo": [{"op": "up", "netns": "x", "ifname": "y"}]},
         "fault #7: operation 'up': missing 'addrs'"),
        ({"undo": [{"op": "unshape", "netns": "x", "ifname": "y", "tier": "core"}]},
         "fault #7: operation 'unshape': 'core' is not a valid Tier"),
    ],
)  # fmt: skip
def test_an_unknown_or_malformed_record_is_a_one_line_error_naming_the_fault(
    fault: dict[str, Any], problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    recorded = {"id": 7, "kind": "loss", "key": "k", "target": "t", "params": {}, "holds": [],
                "undo": [], "since": ""} | fault  # fmt: skip
    record = {"version": 1, "testbed": "tc", "next_id": 8, "faults": [recorded]}
    faults_path("tc").write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(FaultError) as info:
        load_records("tc")
    assert str(info.value) == f"fault record {faults_path('tc')}: {problem}"


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


def test_a_trim_that_fails_to_attach_is_undone_and_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply fails (no such namespace), so does the undo's detach: the error reported is
    the attach's, and the fault is not left in the record."""
    if (reason := trim.unavailable_reason()) is not None:
        pytest.skip(reason)
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    lines: list[str] = []
    faults = Faults(plan(FABRIC, UNBUILT).state(complete=True), log=lines.append)
    with pytest.raises(trim.TrimError, match=f"tc -n {UNBUILT}-p0-t0b -j qdisc show dev h2 root"):
        faults.trim("p0:h2-t0b", None, threshold_bytes=65536, ecn_threshold_bytes=None,
                    rate_bps=1e9)  # fmt: skip
    assert faults.active() == []
    assert len(lines) == 1 and "restore #1 trim p0:h2-t0b p0-t0b>h2" in lines[0]
    assert "FAILED" in lines[0]


def test_trim_rate_and_queue_default_to_the_links_shaping_and_the_fabric_queue() -> None:
    shaped = Fabric(host_link_bps=100e6, fabric_link_bps=400e6, queue_bytes=300_000)
    given: dict[str, Any] = {"threshold_bytes": 65536, "ecn_threshold_bytes": 16384,
                             "probability": None}  # fmt: skip
    to_t0 = trim_settings(shaped, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None, **given)
    assert to_t0 == {"rate_bps": 400_000_000, "trim_threshold_bytes": 65536,
                     "ecn_threshold_bytes": 16384, "last_hop": False, "probability": None,
                     "queue_bytes": 300_000}  # fmt: skip
    to_host = trim_settings(shaped, "p0:h2-t0b", "h2", rate_bps=None, queue_bytes=None, **given)
    assert (to_host["rate_bps"], to_host["last_hop"]) == (100_000_000, True)
    mine = trim_settings(shaped, "p0:h2-t0b", "h2", rate_bps=1e6, queue_bytes=70_000, **given)
    assert (mine["rate_bps"], mine["queue_bytes"]) == (1_000_000, 70_000)
    unshaped = r"^trim p0:t0b-t1a: the link is unshaped, give its rate \(--rate\)$"
    with pytest.raises(FaultError, match=unshaped):
        trim_settings(FABRIC, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None, **given)
    with pytest.raises(FaultError, match=r"threshold 300000 bytes is not below the queue"):
        trim_settings(shaped, "p0:t0b-t1a", "p0-t0b", rate_bps=None, queue_bytes=None,
                      **given | {"threshold_bytes": 300_000})  # fmt: skip


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


# Scenarios -----------------------------------------------------------------------------------
def test_example_scenario_flaps_eight_t0_t1_links_for_three_seconds() -> None:
    text = (REPO / "examples" / "scenario-flap.toml").read_text()
    events = parse_scenario(text, FABRIC).events
    downs = [e for e in events if e.method == "link_down"]
    ups = [e for e in events if e.method == "link_up"]
    assert len(downs) == len(ups) == 8
    assert {e.at for e in downs} == {2.0} and {e.at for e in ups} == {5.0}
    assert all(e.restore for e in ups)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert {dict(e.kwargs)["a"] for e in downs} == {f"p0:t0{r}-t1{t}" for r in "ab" for t in "abcd"}


def test_restores_run_before_new_steps_at_the_same_time() -> None:
    text = """
        [[step]]
        at = "1s"
        action = "loss"
        link = "p0:t0a-t1a"
        rate = 0.1
        duration = "1s"
        [[step]]
        at = 2
        action = "loss"
        link = "p0:t0a-t1a"
        rate = 0.3
    """
    events = parse_scenario(textwrap.dedent(text), FABRIC).events
    assert [(e.at, e.method, e.restore) for e in events] == [
        (1.0, "loss", False),
        (2.0, "clear_loss", True),
        (2.0, "loss", False),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('at = "1s"\naction = "link_dwn"\nlink = "p0:t0a-t1a"', "step 1: action: expected one of"),
        ('action = "restore_all"', "step 1: at: missing"),
        ('at = "1h"\naction = "restore_all"', "step 1: at: bad time"),
        ('at = "1s"\naction = "link_down"\na = "p0-t0a"\nb = "p0-t1z"', "step 1: a: bad link"),
        ('at = "1s"\naction = "link_down"\na = "p0-t0a"', "step 1: b: missing"),
        (
            'at = "1s"\naction = "link_down"\nlink = "p0:t0a-t1a"\ncolor = 1',
            "step 1: color: unknown",
        ),
        ('at = "1s"\naction = "loss"\nlink = "p0:t0a-t1a"', "step 1: rate: missing"),
        ('at = "1s"\naction = "loss"\nlink = "p0:t0a-t1a"\nrate = 3', "step 1: rate: bad rate"),
        (
            'at = "1s"\naction = "link_up"\nlink = "p0:t0a-t1a"\nduration = 1',
            "no automatic restore",
        ),
        (
            'at = "2s"\naction = "nic_down"\nhost = "h0"\nplane = 0\nuntil = "1s"',
            "until: must be after",
        ),
        (
            'at = "1s"\naction = "nic_down"\nhost = "h9"\nplane = 0',
            "step 1: host: host 9 out of range",
        ),
        ('at = "1s"\naction = "switch_fail"\nswitch = "p0-t0z"', "step 1: switch: bad switch"),
        (
            'at = "1s"\naction = "shape"\nlink = "p0:h0-t0a"\nrate = "fast"',
            "step 1: rate: bad rate",
        ),
        ('at = "1s"\naction = "loss"\nlink = "p0:h0-t0a"\nrate = 0.1\nfrom = "h1"', "not an end"),
        (
            'at = "1s"\naction = "trim"\nlink = "p0:t0a-t1a"\nthreshold = "64KiB"',
            r"step 1: rate: missing \(link p0:t0a-t1a is unshaped in this fabric\)",
        ),
    ],
)
def test_scenario_errors_name_the_step_and_key(body: str, message: str) -> None:
    with pytest.raises(FaultScenarioError, match=message) as info:
        parse_scenario("[[step]]\n" + body, FABRIC)
    assert "\n" not in str(info.value)


def test_scenario_trim_takes_the_rate_of_a_shaped_link_by_default() -> None:
    step = '[[step]]\nat = "1s"\naction = "trim"\nlink = "p0:t0a-t1a"\nthreshold = "64KiB"\n'
    shaped = Fabric(fabric_link_bps=200e6)
    [event] = parse_scenario(step, shaped).events
    assert dict(event.kwargs)["rate_bps"] is None  # Faults.trim then uses 200 Mbit/s
    assert dict(event.kwargs)["threshold_bytes"] == 65536


def test_scenario_refuses_taking_a_link_down_twice_and_unknown_tables() -> None:
    twice = """
        [[step]]
        at = 1
        action = "link_down"
        link = "p0:t0a-t1a"
        [[step]]
        at = 2
        action = "link_down"
        a = "p0-t1a"
        b = "p0-t0a"
    """
    with pytest.raises(
        FaultScenarioError, match=r"step 2: link p0:t0a-t1a is already down .*step 1"
    ):
        parse_scenario(textwrap.dedent(twice), FABRIC)
    with pytest.raises(FaultScenarioError, match="steps: unknown key"):
        parse_scenario("steps = []", FABRIC)
    with pytest.raises(FaultScenarioError, match="no steps"):
        parse_scenario('name = "x"', FABRIC)
    with pytest.raises(FaultScenarioError, match="toml"):
        parse_scenario("[[step]\n", FABRIC)
    assert parse_time("250ms") == pytest.approx(0.25)
    assert parse_time(3) == 3.0


@dataclass
class _FakeFault:
    id: int


class _FakeFaults:
    """Records calls; fails on demand.  Stands in for mrcstack.netns.faults.Faults."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_on = fail_on
        self.live: dict[int, str] = {}
        self.next_id = 1

    def __getattr__(self, method: str) -> Any:
        def call(**kwargs: Any) -> list[_FakeFault]:
            self.calls.append((method, kwargs))
            if method == self.fail_on:
                raise FaultError(f"{method} exploded")
            fault = _FakeFault(self.next_id)
            self.live[fault.id] = method
            self.next_id += 1
            return [fault]

        return call

    def active(self) -> list[_FakeFault]:
        return [_FakeFault(i) for i in self.live]

    def clear(self, fault_id: int) -> None:
        self.calls.append(("clear", {"fault": fault_id}))
        del self.live[fault_id]


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


FLAP = """
[[step]]
at = "0.2s"
action = "link_down"
link = "p0:t0a-t1b"
until = "0.6s"
"""


def test_scenario_runs_on_the_clock_and_logs_each_step_in_order() -> None:
    scenario = parse_scenario(FLAP, FABRIC)
    faults, clock, lines = _FakeFaults(), _FakeClock(), list[str]()
    log = run_scenario(scenario, faults, clock=clock, sleep=clock.sleep, log=lines.append)
    assert [m for m, _ in faults.calls] == ["link_down", "link_up"]
    assert clock.sleeps == pytest.approx([0.2, 0.4])
    assert [(e.planned, e.step) for e in log] == [(0.2, 1), (0.6, 1)]
    assert [e.actual for e in log] == pytest.approx([0.2, 0.6])
    assert "link_down a=p0:t0a-t1b" in log[0].text and "automatic restore" in log[1].text
    assert len(lines) == 2 and "step 1: link_down" in lines[0]
    assert log[0].wall < log[1].wall or log[0].wall == log[1].wall


def test_a_failing_step_undoes_what_the_scenario_applied() -> None:
    text = FLAP + '\n[[step]]\nat = "0.3s"\naction = "loss_path"\nswitch = "p0-t1b"\nrate = 0.5\n'
    scenario = parse_scenario(text, FABRIC)
    faults, clock = _FakeFaults(fail_on="loss_path"), _FakeClock()
    with pytest.raises(FaultScenarioError, match=r"step 2 \(loss_path .*\): loss_path exploded"):
        run_scenario(scenario, faults, clock=clock, sleep=clock.sleep, log=lambda _: None)
    assert faults.calls[-1] == ("clear", {"fault": 1})  # the link went down: back up
    assert not faults.live


# CLI -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["loss", "p0:t0a-t1a", "--rate", "2"], "must be in (0, 1]"),
        (["loss", "p0:t0a-t1a"], "--rate is required"),
        (["loss"], "give a link"),
        (["loss", "--path", "p0-t1a", "p0-t0a", "--rate", "0.1"], "takes no link ends"),
        (["shape", "a", "b", "c", "--rate", "1mbit"], "too many arguments"),
        (["shape", "p0:t0a-t1a", "--rate", "fast"], "bad rate"),
        (["trim", "p0:t0a-t1a", "--rate", "1mbit"], "--threshold is required"),
        (["link", "sideways", "p0:t0a-t1a"], "invalid choice"),
        (["nic", "down", "h0", "zero"], "argument PLANE"),
        (["--name", "tc", "explode"], "invalid choice"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        fault_cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_both_clis_act_on_mrc_testbed_unless_given_a_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    monkeypatch.setenv("MRC_TESTBED", "tenv")
    for main, argv in ((fault_cli.main, ["link", "down", "p0:t0a-t1a"]),
                       (testbed_cli.main, ["down"])):  # fmt: skip
        assert main(argv) == 1
        assert "no testbed named 'tenv'" in capsys.readouterr().err
        assert main([*argv, "--name", "tflag"]) == 1
        assert "no testbed named 'tflag'" in capsys.readouterr().err
    monkeypatch.setenv("MRC_TESTBED", "Not-a-name")
    with pytest.raises(SystemExit) as info:
        fault_cli.main(["list"])
    assert info.value.code == 2
    assert testbed_cli.main(["status"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all("bad testbed name 'Not-a-name'" in e for e in errors)


def test_cli_missing_testbed_and_bad_scenario(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    assert fault_cli.main(["--name", "nope", "link", "down", "p0:t0a-t1a"]) == 1
    assert "no testbed named 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nat = "1s"\naction = "link_down"\nlink = "p0:t0a-t9a"\n')
    assert fault_cli.main(["scenario", str(bad), "--check"]) == 2
    assert "step 1: link: bad link" in capsys.readouterr().err
    example = str(REPO / "examples" / "scenario-flap.toml")
    assert fault_cli.main(["--json", "scenario", example, "--check"]) == 0
    timeline = json.loads(capsys.readouterr().out)
    assert len(timeline) == 19 and timeline[0]["method"] == "link_down"
    assert fault_cli.main(["--name", "nope", "list"]) == 0
    assert capsys.readouterr().out.strip() == "no active faults"


# Live: one default testbed -------------------------------------------------------------------
ROOT_REASON = "needs root (network namespaces)" if os.geteuid() != 0 else None
PORT = 9777
PAUSE_EVERY = 100  # datagrams between pauses: stays far below veth's per-CPU backlog
DRAIN_IDLE_S = 0.2  # the receiver is done when nothing more came for this long


@dataclass(frozen=True)
class Live:
    state: TestbedState
    faults: Faults
    log: list[str]

    def ns(self, node: str) -> str:
        return str(self.state.ns(node))


def send(
    live: Live,
    src: str,
    dst: str,
    jobs: list[tuple[str, bytes, int]],
    pause: float = 0.001,
    port: int = PORT,
    tclass: int | None = None,
) -> dict[str, Any]:
    """Send ``count`` copies of each payload to each address from host ``src`` (sockets
    made inside the namespaces by mrcstack.netns.traffic, zero UDP checksums, traffic class
    ``tclass``); return what host ``dst`` received: ``counts`` by the payload's first 4
    bytes, every datagram (``raw``) with its traffic class (``tclass``), and the
    time.monotonic() when sending began (``started``) and the last datagram was read
    (``last_read``).  The sending thread stays on one CPU meanwhile: veth hands a packet to
    the sending CPU's backlog, so packets cross the fabric in the order sent."""
    receiver = traffic.udp_receiver(live.ns(dst), port)  # 8 MiB buffer: holds a whole test
    sender = traffic.udp_sender(live.ns(src), tclass=tclass)
    cpus = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cpus)})
        started = time.monotonic()
        sent = 0
        for address, data, count in jobs:
            for _ in range(count):
                with contextlib.suppress(OSError):  # no route while a NIC is down
                    sender.sendto(data, (address, port))
                sent += 1
                if sent % PAUSE_EVERY == 0:
                    time.sleep(pause)
        os.sched_setaffinity(0, cpus)
        counts: dict[str, int] = {}
        raw: list[bytes] = []
        tclasses: list[int | None] = []
        last_read = started
        while (dgram := traffic.receive(receiver, DRAIN_IDLE_S)) is not None:
            last_read = time.monotonic()
            key = dgram.data[:4].hex()
            counts[key] = counts.get(key, 0) + 1
            raw.append(dgram.data)
            tclasses.append(dgram.tclass)
        return {"counts": counts, "raw": raw, "tclass": tclasses, "started": started,
                "last_read": last_read}  # fmt: skip
    finally:
        os.sched_setaffinity(0, cpus)
        sender.close()
        receiver.close()


def tag(index: int) -> bytes:
    return index.to_bytes(4, "big") + bytes(60)


def probe(live: Live, src: str, dst: str, count: int = 40) -> dict[FabricPath, int]:
    """Datagrams received per path from ``src`` to ``dst`` (``count`` sent on each)."""
    fabric = live.state.fabric
    every = paths(fabric, int(src[1:]), int(dst[1:]))
    got = send(live, src, dst, [(str(p.address), tag(i), count) for i, p in enumerate(every)])
    return {p: got["counts"].get(tag(i)[:4].hex(), 0) for i, p in enumerate(every)}


def check_paths(
    live: Live, src: str, dst: str, dead: Any, count: int = 40
) -> dict[FabricPath, int]:
    """Paths for which ``dead(path)`` is true carry nothing; every other path delivers."""
    got = probe(live, src, dst, count)
    wrong = {
        f"{p.address} {'-'.join(p.nodes)}": n
        for p, n in got.items()
        if (n != 0 if dead(p) else n < 0.9 * count)
    }
    assert not wrong, f"{src}->{dst}: paths delivering wrongly (received of {count}): {wrong}"
    assert any(not dead(p) for p in got), "the check needs at least one live path"
    return got


def all_alive(path: FabricPath) -> bool:
    return False


def tables(ns: str) -> list[str]:
    """What must be exactly as before a fault: every route (all tables), address and link
    state of the namespace.  Sorted: the kernel lists equal prefixes on different ports in
    the order they were added, which a flap changes."""
    lines: list[str] = []
    for cmd in (["-6", "route", "show", "table", "all"], ["-6", "-o", "address", "show"],
                ["-o", "link", "show"]):  # fmt: skip
        out = subprocess.run(["ip", "-n", ns, *cmd], capture_output=True, text=True, check=True)
        lines += out.stdout.splitlines()
    return sorted(lines)


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    if exists(TESTBED):
        testbed.clean(TESTBED)  # a previous run was killed: start from nothing
    log: list[str] = []
    try:
        testbed.up(FABRIC, TESTBED)
        state = load(TESTBED)
        yield Live(state, Faults(state, log=log.append), log)
    finally:
        testbed.clean(TESTBED)
    assert not faults_path(TESTBED).exists()
    assert not faults_log_path(TESTBED).exists()  # clean removes the log too
    left = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert not [line for line in left.splitlines() if line.startswith(f"{TESTBED}-")]


@pytest.fixture
def clean_after(live: Live) -> Iterator[Live]:
    """Every live test leaves no fault behind, even when it fails."""
    try:
        yield live
    finally:
        live.faults.restore_all()


def through_link(link: str) -> Any:
    return lambda p: link in p.physical_links


def through_switch(switch: str) -> Any:
    return lambda p: switch in p.nodes


def test_live_baseline_every_path_delivers_both_ways(clean_after: Live) -> None:
    check_paths(clean_after, "h0", "h2", all_alive)
    check_paths(clean_after, "h3", "h1", all_alive)
    check_paths(clean_after, "h0", "h1", all_alive)


def test_live_link_down_stops_exactly_its_paths_and_up_restores_everything(
    clean_after: Live,
) -> None:
    live, link = clean_after, "p0:t0a-t1b"
    ends = [live.ns("p0-t0a"), live.ns("p0-t1b")]
    before = {ns: tables(ns) for ns in ends}
    [fault] = live.faults.link_down("p0-t1b", "p0-t0a")
    assert fault.kind == "link_down" and fault.target == link
    shown = subprocess.run(["ip", "-n", ends[0], "-o", "link", "show", "dev", "t1b"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "state DOWN" in shown
    check_paths(live, "h0", "h2", through_link(link))
    check_paths(live, "h2", "h0", through_link(link))  # the way back crosses t1b -> t0a
    with pytest.raises(FaultError, match="already down"):
        live.faults.link_down(link)
    live.faults.link_up(link)
    assert {ns: tables(ns) for ns in ends} == before  # trap 1: routes and fe80::1/2 are back
    check_paths(live, "h0", "h2", all_alive)
    check_paths(live, "h2", "h0", all_alive)
    with pytest.raises(FaultError, match="is not down"):
        live.faults.link_up(link)
    assert any("apply #" in line and "link_down p0:t0a-t1b" in line for line in live.log)


def test_live_port_state_and_addresses_read_and_set_in_process(clean_after: Live) -> None:
    """The harness sets a port's state with an ioctl from a thread in its namespace and
    reads the addresses it must restore from if_inet6: both agree with ``ip``."""
    ns = clean_after.ns("p0-t0a")

    def ip_json(*args: str) -> dict[str, Any]:
        out = subprocess.run(["ip", "-n", ns, "-j", *args], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
        [dev] = json.loads(out)
        return dict(dev)

    def is_up(ifname: str) -> bool:
        return "UP" in ip_json("link", "show", "dev", ifname)["flags"]

    for ifname in ("t1a", "h0"):
        want = [Address(a["local"], a["prefixlen"], bool(a.get("nodad")))
                for a in ip_json("-6", "address", "show", "dev", ifname)["addr_info"]
                if a.get("scope") == "global" or a.get("nodad")]  # fmt: skip
        assert want, f"{ifname}: the check needs a port with addresses"
        key = lambda a: a.local  # noqa: E731
        assert sorted(faultops.addresses(ns, ifname), key=key) == sorted(want, key=key)
    # A spare veth pair in the namespace: toggling a fabric port would cost it its routes.
    subprocess.run(["ip", "-n", ns, "link", "add", "tcx0", "type", "veth", "peer", "name", "tcx1"],
                   check=True)  # fmt: skip
    try:
        ifctl.set_link(ns, "tcx0", up=True)
        assert is_up("tcx0")
        ifctl.set_link(ns, "tcx0", up=False)
        assert not is_up("tcx0")
    finally:
        subprocess.run(["ip", "-n", ns, "link", "del", "tcx0"], check=True)
    with pytest.raises(TestbedError, match="nosuchport"):
        ifctl.set_link(ns, "nosuchport", up=False)


def test_live_nftables_rule_sets_loaded_in_process(clean_after: Live) -> None:
    """The harness loads a fault's nftables table through libnftables from a thread in the
    namespace: ``nft`` itself sees it there, and only there; errors name the namespace."""
    if not nftlib.available():
        pytest.skip("libnftables cannot be loaded here: faults run the nft program instead")
    ns = clean_after.ns("p1-t1a")
    other = clean_after.ns("p1-t1b")

    def tables(netns: str) -> str:
        return subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "tables"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    nftlib.run(ns, "table inet mrc_nftlib_test {\n chain c { type filter hook forward "
                   "priority 0; policy accept; }\n}\n")  # fmt: skip
    try:
        assert "mrc_nftlib_test" in tables(ns)
        assert "mrc_nftlib_test" not in tables(other) and "mrc_nftlib_test" not in tables_root()
    finally:
        faultops.nft_delete(ns, "mrc_nftlib_test")
    assert "mrc_nftlib_test" not in tables(ns)
    faultops.nft_delete(ns, "mrc_nftlib_test")  # already gone: not an error
    with pytest.raises(TestbedError, match=rf"nft in {ns}: .*syntax"):
        nftlib.run(ns, "this is not nftables")


def tables_root() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_live_overlapping_link_faults_on_one_switch_restore_one_at_a_time(
    clean_after: Live,
) -> None:
    live = clean_after
    t0 = live.ns("p1-t0a")
    before = tables(t0)
    live.faults.link_down("p1:t0a-t1a")
    live.faults.link_down("p1:t0a-t1b")
    live.faults.nic_down("h0", 1)
    check_paths(live, "h1", "h2", lambda p: p.plane == 1 and p.nodes[2] in ("p1-t1a", "p1-t1b"))
    live.faults.link_up("p1:t0a-t1a")  # t1b and h0's NIC still down: their routes stay out
    check_paths(live, "h1", "h2", lambda p: p.plane == 1 and p.nodes[2] == "p1-t1b")
    live.faults.link_up("p1:t0a-t1b")
    live.faults.nic_up("h0", 1)
    assert tables(t0) == before
    check_paths(live, "h1", "h2", all_alive)
    check_paths(live, "h0", "h3", all_alive)


def _link_flags(ns: str, ifname: str) -> list[str]:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", ifname],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    flags: list[str] = json.loads(out)[0]["flags"]
    return flags


def test_live_armed_fault_is_recorded_at_once_and_applied_only_by_fire(clean_after: Live) -> None:
    """``arm`` plans and records a fault without touching the fabric; ``fire`` applies it
    (once); restore undoes it as any other, with every route and address back."""
    live, link = clean_after, "p0:t0a-t1b"
    ends = [live.ns("p0-t0a"), live.ns("p0-t1b")]
    before = {ns: tables(ns) for ns in ends}
    armed = live.faults.arm(lambda f: f.link_down(link))
    [fault] = armed.faults
    assert [f.id for f in live.faults.active()] == [fault.id]
    assert "UP" in _link_flags(ends[0], "t1b") and "UP" in _link_flags(ends[1], "t0a")
    with pytest.raises(FaultError, match="already down"):  # the record holds the link
        live.faults.link_down(link)
    assert armed.fire() == [fault]
    assert "UP" not in _link_flags(ends[0], "t1b") and "UP" not in _link_flags(ends[1], "t0a")
    check_paths(live, "h0", "h2", through_link(link))
    with pytest.raises(FaultError, match="fire once"):
        armed.fire()
    armed.cancel()  # after fire: nothing to forget, the fault stays
    assert [f.id for f in live.faults.active()] == [fault.id]
    live.faults.link_up(link)
    assert {ns: tables(ns) for ns in ends} == before
    assert any("apply #" in line and f"link_down {link}" in line for line in live.log)


def test_live_armed_faults_that_never_fire_leave_nothing(clean_after: Live) -> None:
    """A cancelled arm forgets its records; one left armed is undone harmlessly by
    restore_all; an arm that fails records nothing."""
    live = clean_after
    ns = live.ns("h1")
    before = tables(ns)
    armed = live.faults.arm(lambda f: f.nic_down("h1", 1))
    assert len(live.faults.active()) == 1
    armed.cancel()
    assert live.faults.active() == [] and tables(ns) == before
    with pytest.raises(FaultError, match="fire once"):
        armed.fire()
    live.faults.arm(lambda f: (f.nic_down("h1", 1), f.switch_blackhole("p1-t1b")))
    assert len(live.faults.active()) == 2
    live.faults.restore_all()  # nothing applied: a port set up again, a table already gone
    assert live.faults.active() == [] and tables(ns) == before
    check_paths(live, "h1", "h2", all_alive)

    def fails(f: Faults) -> None:
        f.nic_down("h1", 1)
        f.nic_down("h1", 1)  # the first one's record holds the port

    with pytest.raises(FaultError, match="already down"):
        live.faults.arm(fails)
    assert live.faults.active() == []
    live.faults.nic_down("h1", 1)
    with pytest.raises(FaultError, match="not an undo"):  # it would act at once
        live.faults.arm(lambda f: f.nic_up("h1", 1))
    assert len(live.faults.active()) == 1  # still down
    live.faults.nic_up("h1", 1)
    assert tables(ns) == before


def test_resident_namespace_threads_serve_calls_until_closed(clean_after: Live) -> None:
    """Inside ``resident_netns`` every call for a namespace runs on one thread that joined
    it beforehand (in that namespace: its own ports); outside, each call has a new thread."""
    ns, other = clean_after.ns("p0-t1a"), clean_after.ns("p0-t1b")

    def where() -> tuple[threading.Thread, str]:  # the object: a thread id can be reused
        return threading.current_thread(), Path("/proc/thread-self/net/dev").read_text()

    with resident_netns([ns, ns]):
        (one, dev), (two, _) = call_in_netns(ns, where), call_in_netns(ns, where)
        assert one is two and "t0a:" in dev and "h0:" not in dev
        _, other_dev = call_in_netns(other, where)  # not resident: still in its namespace
        assert "t0a:" in other_dev
        with pytest.raises(ZeroDivisionError):
            call_in_netns(ns, lambda: 1 // 0)  # errors reach the caller; the thread stays
        assert call_in_netns(ns, where)[0] is one
        assert call_in_netns(ns, lambda: call_in_netns(ns, where))[0] is one  # no deadlock
    assert call_in_netns(ns, where)[0] is not one
    with pytest.raises(TestbedError, match="does not exist"), resident_netns(["nosuchns-x"]):
        pass
    closed = run_module._Resident(ns)
    closed.close()
    with pytest.raises(run_module._ClosedError):  # call_in_netns then starts a fresh thread
        closed.call(where)


def test_live_switch_fail_and_restore(clean_after: Live) -> None:
    live = clean_after
    switch_ns = live.ns("p1-t1c")
    before = tables(switch_ns)
    live.faults.switch_fail("p1-t1c")
    with pytest.raises(FaultError, match=r"holds it; undo that"):
        live.faults.link_up("p1:t0a-t1c")  # held down by the switch failure, not by itself
    with pytest.raises(FaultError, match=r"already down \(#\d+ switch_fail p1-t1c\)"):
        live.faults.link_down("p1:t0b-t1c")
    check_paths(live, "h0", "h3", through_switch("p1-t1c"))
    check_paths(live, "h3", "h0", through_switch("p1-t1c"))
    live.faults.switch_restore("p1-t1c")
    assert tables(switch_ns) == before
    check_paths(live, "h0", "h3", all_alive)


def test_live_switch_blackhole_keeps_links_up_but_forwards_nothing(clean_after: Live) -> None:
    live = clean_after
    live.faults.switch_blackhole("p2-t1a")
    for end in (rec.end("p2-t1a") for rec in live.state.switch_links("p2-t1a")):
        shown = subprocess.run(["ip", "-n", end.netns, "-o", "link", "show", "dev", end.ifname],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "state UP" in shown and "LOWER_UP" in shown, shown
    check_paths(live, "h1", "h2", through_switch("p2-t1a"))
    check_paths(live, "h2", "h1", through_switch("p2-t1a"))
    live.faults.switch_restore("p2-t1a")
    check_paths(live, "h1", "h2", all_alive)


def test_live_nic_down_cuts_the_host_off_one_plane(clean_after: Live) -> None:
    live = clean_after
    host_ns = live.ns("h0")
    before = tables(host_ns)
    live.faults.nic_down("h0", 3)
    check_paths(live, "h0", "h2", lambda p: p.plane == 3)
    check_paths(live, "h1", "h0", lambda p: p.plane == 3)  # same rack: via p3-t0a only
    check_paths(live, "h2", "h0", lambda p: p.plane == 3)  # the T0 keeps routing to h0
    live.faults.nic_up("h0", 3)
    assert tables(host_ns) == before
    check_paths(live, "h0", "h2", all_alive)
    check_paths(live, "h2", "h0", all_alive)  # at once: no stale neighbour entry at the T0


def _one_path(live: Live, src: str, dst: str, *nodes: str) -> FabricPath:
    fabric = live.state.fabric
    return next(p for p in paths(fabric, int(src[1:]), int(dst[1:])) if set(nodes) <= set(p.nodes))


def test_live_link_loss_rate_is_within_bounds_one_direction_only(clean_after: Live) -> None:
    live = clean_after
    [fault] = live.faults.loss("p0-t0a", "p0-t1c", "20%", from_node="p0-t0a")
    assert fault.params == {"rate": 0.2}
    lossy = _one_path(live, "h0", "h2", "p0-t1c")
    other = _one_path(live, "h0", "h2", "p0-t1d")
    back = _one_path(live, "h2", "h0", "p0-t1c")  # t1c -> t0a: the other direction
    got = send(
        live, "h0", "h2", [(str(lossy.address), tag(1), 5000), (str(other.address), tag(2), 500)]
    )
    received = got["counts"].get(tag(1)[:4].hex(), 0)
    assert 0.15 <= 1 - received / 5000 <= 0.25, f"lost {5000 - received} of 5000"
    assert got["counts"].get(tag(2)[:4].hex(), 0) >= 495
    got_back = send(live, "h2", "h0", [(str(back.address), tag(3), 500)])
    assert got_back["counts"].get(tag(3)[:4].hex(), 0) >= 495
    assert live.faults.clear(f"#{fault.id}") == [fault]
    with pytest.raises(FaultError, match="no loss on p0:t0a-t1c"):
        live.faults.clear_loss("p0:t0a-t1c")
    check_paths(live, "h0", "h2", all_alive)


def test_live_host_link_loss_both_directions(clean_after: Live) -> None:
    live = clean_after
    faults = live.faults.loss("p2:h1-t0a", None, 0.5)
    assert len(faults) == 2  # one per direction, both in the T0's forward hook
    path = _one_path(live, "h1", "h3", "p2-t1b")
    up = send(live, "h1", "h3", [(str(path.address), tag(1), 2000)])["counts"]
    assert 0.4 <= 1 - up.get(tag(1)[:4].hex(), 0) / 2000 <= 0.6
    back = _one_path(live, "h3", "h1", "p2-t1b")
    down = send(live, "h3", "h1", [(str(back.address), tag(1), 2000)])["counts"]
    assert 0.4 <= 1 - down.get(tag(1)[:4].hex(), 0) / 2000 <= 0.6
    live.faults.clear_loss("p2:h1-t0a")
    check_paths(live, "h1", "h3", all_alive)


def test_live_path_loss_drops_packets_crossing_one_switch_only(clean_after: Live) -> None:
    live = clean_after
    live.faults.loss_path("fcbb:bb00:2103::/48", 0.3)  # p1-t1d, by its locator
    through = _one_path(live, "h0", "h2", "p1-t1d")
    beside = _one_path(live, "h0", "h2", "p1-t1c")
    back = _one_path(live, "h3", "h1", "p1-t1d")
    got = send(
        live, "h0", "h2", [(str(through.address), tag(1), 3000), (str(beside.address), tag(2), 500)]
    )
    assert 0.25 <= 1 - got["counts"].get(tag(1)[:4].hex(), 0) / 3000 <= 0.35
    assert got["counts"].get(tag(2)[:4].hex(), 0) >= 495
    got_back = send(live, "h3", "h1", [(str(back.address), tag(3), 3000)])
    assert 0.25 <= 1 - got_back["counts"].get(tag(3)[:4].hex(), 0) / 3000 <= 0.35
    with pytest.raises(FaultError, match="no path loss"):
        live.faults.clear_loss(path="p1-t1c")
    live.faults.clear_loss(path="p1-t1d")
    check_paths(live, "h0", "h2", all_alive)


def _tc_stats(ns: str, ifname: str) -> list[dict[str, Any]]:
    out = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", ifname],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return list(json.loads(out))


def test_live_shape_limits_throughput_and_unshape_restores(clean_after: Live) -> None:
    live = clean_after
    port = live.state.port("p3-t0a", "p3-t1a")
    rate_bps, queue = 10e6, 16384
    [fault] = live.faults.shape("p3:t0a-t1a", None, rate_bps, queue, from_node="p3-t0a")
    assert fault.kind == "shape"
    [qdisc] = [q for q in _tc_stats(port.netns, port.ifname) if q.get("root")]
    assert qdisc["kind"] == "tbf"
    assert (qdisc["options"]["rate"], qdisc["options"]["limit"]) == (rate_bps / 8, queue)
    burst = qdisc["options"]["burst"]
    path = _one_path(live, "h0", "h2", "p3-t1a")
    payload = tag(1) + bytes(936)
    blast = send(live, "h0", "h2", [(str(path.address), payload, 2000)], pause=0.0005)
    received = blast["counts"].get(tag(1)[:4].hex(), 0)
    # A token bucket passes at most burst + rate x time, counted in Ethernet frames; the
    # window (first send to last read) can only be longer than the real one: no flake.
    window = blast["last_read"] - blast["started"]
    frames = received * (L2_L4 + len(payload))
    assert frames <= rate_bps / 8 * window * 1.5 + burst, (received, window)
    assert 0 < received < 2000
    [qdisc] = [q for q in _tc_stats(port.netns, port.ifname) if q.get("root")]
    assert qdisc["drops"] > 0 and qdisc["drops"] + received <= 2000
    live.faults.link_down("p3:t0a-t1a")  # a flap keeps the shaping (qdiscs outlive down)
    live.faults.link_up("p3:t0a-t1a")
    assert [q["kind"] for q in _tc_stats(port.netns, port.ifname) if q.get("root")] == ["tbf"]
    live.faults.unshape("p3:t0a-t1a")
    assert not [q for q in _tc_stats(port.netns, port.ifname) if q.get("kind") == "tbf"]
    again = send(live, "h0", "h2", [(str(path.address), payload, 2000)])
    assert again["counts"].get(tag(1)[:4].hex(), 0) >= 1980


def test_live_trim_wraps_the_trim_program(clean_after: Live) -> None:
    if (reason := trim.unavailable_reason()) is not None:
        pytest.skip(reason)
    live = clean_after
    faults = live.faults.trim("p0:h2-t0b", None, threshold_bytes=1 << 20,
                              ecn_threshold_bytes=None, rate_bps=1e9, probability=1.0)  # fmt: skip
    assert [f.params["last_hop"] for f in faults] == [True]  # the host's own port never trims
    port = live.state.port("p0-t0b", "h2")
    assert trim.attached(port.netns, port.ifname)
    with pytest.raises(FaultError, match="is taken by"):
        live.faults.shape("p0:h2-t0b", None, 1e6, from_node="p0-t0b")  # one qdisc per port
    packet = encode(DataPacket(qpn=7, psn=1, va=0, rkey=1, payload=bytes(1000), ev=0, port=0,
                               tx_seq=1, ts_ns=1), CrcIntegrity())  # fmt: skip
    path = _one_path(live, "h0", "h2", "p0-t1a")
    got = send(live, "h0", "h2", [(str(path.address), packet, 20)], port=4791, tclass=TCLASS_DATA)
    raw = got["raw"]
    assert len(raw) == 20
    assert all(len(d) == trimmed_length(packet[0]) for d in raw)
    assert all(d == encode_trimmed(packet, True) for d in raw)
    assert trim.counters(port.netns, port.ifname)["trimmed"] >= 20
    live.faults.untrim("p0:h2-t0b")
    assert not trim.attached(port.netns, port.ifname)
    check_paths(live, "h0", "h2", all_alive)


TRIM_RATE_BPS = 1_000_000  # a burst of a hundred packets is far over it on any machine
TRIM_THRESHOLD, ECN_THRESHOLD = 48_000, 16_000  # bytes of queue (Ethernet frames)


@pytest.mark.parametrize(("switch", "peer"), [("p0-t1a", "p0-t0b"), ("p0-t0b", "h2")])
def test_live_trim_in_congestion_marks_as_documented(
    clean_after: Live, switch: str, peer: str
) -> None:
    """A burst of 120 core-encoded writes (1 KiB, every third with an immediate), in the data
    class (DSCP 4) and ECT(0), from h0 to h2 along the uSID path through p0-t1a, into a
    trimmed 1 Mbit/s port: the T1's port toward the T0, or the T0's last-hop port toward h2.

    The program's queue starts empty and packet i (in send order) finds at most i frames
    in it, so: every packet whose frame and all before it fit under the trim threshold
    arrives whole; CE only on a packet that had more than the ECN threshold before it; the
    burst is far over the rate, so the port does trim and (not last hop) mark."""
    if (reason := trim.unavailable_reason()) is not None:
        pytest.skip(reason)
    live, last_hop = clean_after, peer == "h2"
    path = _one_path(live, "h0", "h2", "p0-t1a")
    send(live, "h0", "h2", [(str(path.address), tag(9), 5)])  # neighbours resolved first
    [fault] = live.faults.trim(switch, peer, threshold_bytes=TRIM_THRESHOLD,
                               ecn_threshold_bytes=ECN_THRESHOLD, rate_bps=TRIM_RATE_BPS,
                               from_node=switch)  # fmt: skip
    assert fault.params["last_hop"] is last_hop
    assert fault.params["queue_bytes"] == live.state.fabric.queue_bytes  # the default
    sent = data_packets(120, 1024)
    by_psn = {psn_of(d): d for d in sent}
    wire = L2_L4 + max(len(d) for d in sent)
    jobs = [(str(path.address), d, 1) for d in sent]
    got = send(live, "h0", "h2", jobs, pause=0.0, port=DEFAULT_PORT, tclass=TCLASS_DATA)
    port = live.state.port(switch, peer)
    stats = trim.counters(port.netns, port.ifname)
    live.faults.untrim(switch, peer)

    arrived = list(zip(got["raw"], got["tclass"], strict=True))
    assert sorted(psn_of(d) for d, _ in arrived) == sorted(by_psn)  # trimmed, never dropped
    trimmed = [d for d, _ in arrived if len(d) < 100]
    whole = [d for d, _ in arrived if len(d) >= 100]
    assert trimmed, "a burst far over the port rate was not trimmed"
    for d in trimmed:  # docs/trimming.md: UDP payload 8 + 64 (68 with ImmDt), flags set
        assert len(d) == (DATA_IMM_HDR_LEN if d[0] in IMM_OPCODES
                          else DATA_HDR_LEN) == trimmed_length(d[0])  # fmt: skip
        check_trimmed(d, by_psn[psn_of(d)], last_hop)  # TRIMMED, TRIM_LASTHOP iff last hop
    for d in whole:
        assert d == by_psn[psn_of(d)]
    # Trimmed headers are remarked to the trimmed class; whole packets keep the data class.
    assert {tc >> 2 for d, tc in arrived if len(d) < 100 and tc is not None} == {Dscp.TRIMMED}
    assert {tc >> 2 for d, tc in arrived if len(d) >= 100 and tc is not None} == {Dscp.DATA}
    assert stats["class_data"] >= len(arrived)
    under = {psn for psn in by_psn if (psn + 1) * wire <= TRIM_THRESHOLD}
    assert under and under <= {psn_of(d) for d in whole}  # nothing trimmed under threshold
    assert all(tc is not None and tc & ECN_MASK in (ECT0, CE) for _, tc in arrived)
    marked = {psn_of(d) for d, tc in arrived if tc is not None and tc & ECN_MASK == CE}
    assert stats["ecn_marked"] == len(marked) and stats["trimmed"] == len(trimmed)
    if last_hop:
        assert not marked  # never on a port facing a host, however long the queue
    else:
        assert marked, "the queue went over the ECN threshold but nothing was marked"
        assert min(marked) * wire > ECN_THRESHOLD  # only above the threshold
        assert not marked & {psn_of(d) for d in trimmed}  # a trimmed packet is not marked
    assert not trim.attached(port.netns, port.ifname)
    check_paths(live, "h0", "h2", all_alive)


def test_live_scenario_replays_a_flap_and_logs_both_steps(clean_after: Live) -> None:
    live = clean_after
    before = tables(live.ns("p0-t0a"))
    scenario = parse_scenario(FLAP, live.state.fabric)
    lines: list[str] = []
    down_seen: list[bool] = []

    def watch() -> None:  # the link is down at some point between the two steps
        while not lines:
            time.sleep(0.01)
        shown = subprocess.run(["ip", "-n", live.ns("p0-t0a"), "-o", "link", "show", "dev", "t1b"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        down_seen.append("state DOWN" in shown)

    watcher = threading.Thread(target=watch)
    watcher.start()
    log = run_scenario(scenario, live.faults, log=lines.append)
    watcher.join()
    assert [(e.step, e.planned) for e in log] == [(1, 0.2), (1, 0.6)]
    assert "link_down" in log[0].text and "link_up" in log[1].text
    assert log[0].actual >= 0.2 and log[1].actual >= 0.6 and log[0].wall <= log[1].wall
    assert down_seen == [True]
    assert not live.faults.active()
    assert tables(live.ns("p0-t0a")) == before
    check_paths(live, "h0", "h2", all_alive)


def test_live_records_let_another_process_restore_everything(
    clean_after: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    live = clean_after
    assert fault_cli.main(["link", "down", "p3-t1d", "p3-t0b", "--name", TESTBED]) == 0
    assert "link_down p3:t0b-t1d" in capsys.readouterr().out
    live.faults.switch_blackhole("p2-t1c")
    live.faults.loss("p1:h3-t0b", None, 0.1)
    listed = subprocess.run(
        [sys.executable, "-m", "mrcstack.netns.faults.cli", "--name", TESTBED, "list", "--json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    assert sorted(f["kind"] for f in json.loads(listed.stdout)) == [
        "blackhole", "link_down", "loss", "loss"
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "mrcstack.netns.faults.cli", "--name", TESTBED, "restore-all"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("restore #") == 4  # each undo logged with its timestamp
    assert not live.faults.active()
    check_paths(live, "h0", "h3", all_alive)
    check_paths(live, "h3", "h0", all_alive)
    assert "restore #" in live.faults.log_path.read_text()
