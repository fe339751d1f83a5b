"""What the fault harness records (:mod:`mrcstack.netns.faults.records`): each fault and
its operations as typed values, their JSON form, records the first version wrote, and a
handler for every kind of operation (:mod:`mrcstack.netns.faults.ops`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mrcstack.netns.faults import ops as faultops
from mrcstack.netns.faults.plan import FaultError, nft_ruleset
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
    save_records,
)
from mrcstack.netns.state import faults_path


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
RECORDS_V1 = Path(__file__).resolve().parent / "data"
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
