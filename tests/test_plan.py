"""``mrcstack plan``: the paper's design numbers from the formulas, the formulas' shape on
other inputs, one-line errors for what cannot be built, and its fabric description read
by the simulator (a large case) and ``render`` (the testbed's, a small case, in
``test_plan_live.py``)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrcstack import plan, render
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, run

PAPER = plan.Request(endpoints=131_072)


def test_the_papers_design_numbers() -> None:
    p = plan.plan(PAPER)
    two, three = p.two_tier, p.single_plane
    assert three is not None
    assert (two.reach, two.per_tier, two.hosts_per_t0, two.uplinks_per_t0) == (
        131_072, (512, 256), 256, 256,
    )  # fmt: skip
    assert two.switches == 8 * (512 + 256) == 6_144
    assert three.radix == 64 and three.per_tier == (4_096, 4_096, 2_048)
    assert three.switches == 10_240 and three.reach == 65_536  # k^3/4: fewer than asked
    assert p.switch_ratio == pytest.approx(3 / 5, rel=1e-12)
    assert p.optics_ratio == pytest.approx(2 / 3, rel=1e-12)
    assert (two.optics(800e9), three.optics(800e9)) == (524_288, 786_432)
    assert (two.longest_path, three.longest_path) == (3, 5)
    assert (two.lost_uplink, three.lost_uplink) == (Fraction(1, 256), Fraction(1, 32))
    assert two.lost_port == Fraction(1, 8)


def test_four_tiers_and_oversubscription() -> None:
    four = plan.plan(plan.Request(131_072, tiers=4)).single_plane
    assert four is not None and four.per_tier == (4_096, 4_096, 4_096, 2_048)
    assert four.longest_path == 7 and four.reach == 2 * 32**4
    three_to_one = plan.two_tier(plan.Request(131_072, oversubscription=Fraction(3)))
    assert (three_to_one.hosts_per_t0, three_to_one.uplinks_per_t0) == (384, 128)
    assert three_to_one.per_tier == (342, 128)  # ceil(131072 / 384) T0s
    assert three_to_one.lost_uplink == Fraction(1, 128)


@given(
    endpoints=st.integers(2, 20_000),
    planes=st.sampled_from([1, 2, 4, 8]),
    half=st.sampled_from([8, 16, 32, 64, 128, 256]),
)
def test_every_design_connects_its_endpoints_within_its_switches(
    endpoints: int, planes: int, half: int
) -> None:
    """Whatever the input, a design has room for every endpoint, every T0 uplink lands on
    a T1 port, and the single-plane counts grow with the endpoints as the formulas say."""
    req = plan.Request(endpoints, planes=planes, radix=2 * half * planes)
    try:
        p = plan.plan(req)
    except plan.PlanError as exc:
        assert endpoints > req.radix * half and "more than two tiers" in str(exc)
        return
    t0, t1 = p.two_tier.per_tier
    assert t0 * p.two_tier.hosts_per_t0 >= endpoints > (t0 - 1) * p.two_tier.hosts_per_t0
    assert t0 * p.two_tier.uplinks_per_t0 == t1 * p.two_tier.links_per_t0_t1 * t0
    assert t0 * p.two_tier.links_per_t0_t1 <= req.radix  # each T1's ports suffice
    single = p.single_plane
    if single is not None:
        assert single.per_tier[0] * single.hosts_per_t0 >= endpoints
        assert single.links == endpoints + 2 * single.per_tier[0] * single.uplinks_per_t0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--gpus", "131073"], "131,073 endpoints need more than two tiers"),
        (["--gpus", "64", "--oversubscription", "2"], "does not split the 512 ports"),
        (["--gpus", "64", "--planes", "0"], "planes must be at least 1"),
        (["--gpus", "64", "--speed", "fast"], "bad rate 'fast'"),
        (["--gpus", "131072", "--fabric-out", "x.toml"], "does not fit a fabric description"),
        (["--gpus", "64", "--fabric-out", "x.toml", "--scale", "3"], "--scale 3 must divide"),
        (["--gpus", "64", "--scale", "2"], "--scale applies to --fabric-out only"),
    ],
)
def test_bad_input_gets_one_line_saying_why(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    try:
        code = plan.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(str(exc.code))
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mrcstack plan: error: ") and says in err
    assert not (tmp_path / "x.toml").exists()


def test_a_radix_the_planes_cannot_split_still_plans_two_tiers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan.main(["--gpus", "8", "--planes", "4", "--radix", "4"]) == 0
    out = capsys.readouterr().out
    assert "no single-plane design: radix 4 at 400gbit is 1 port(s)" in out
    assert "T1 per plane" in out and "a lost NIC port costs" in out


def test_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--gpus", "131072"]) == 0
    out = capsys.readouterr().out
    assert "6,144" in out and "10,240  (x0.6)" in out and "(x0.667)" in out
    assert "0.39% of a node" in out and "3.1% of a node" in out
    assert "reach 65,536 endpoints, fewer than 131,072" in out
    assert plan.main(["--gpus", "131072", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["two_tier"]["switches"] == 6_144 and doc["switch_ratio"] == pytest.approx(0.6)


def test_the_fabric_out_file_runs_in_the_simulator_and_render(tmp_path: Path) -> None:
    """The paper's design scaled down by 16 (radix 32: 32 T0s of 16 hosts, 16 T1s, 8
    planes, 512 hosts) is read by the simulator, which moves data across it, and by
    render, which writes a switch's table."""
    out = tmp_path / "paper.toml"
    assert plan.main(["--gpus", "131072", "--fabric-out", str(out), "--scale", "16"]) == 0
    fabric = Fabric.load(out)
    assert (fabric.planes, fabric.racks, fabric.hosts_per_rack, fabric.t1_per_plane) == (
        8, 32, 16, 16,
    )  # fmt: skip
    assert fabric.host_link_bps == fabric.fabric_link_bps == 100e9
    assert "scaled down by 16" in out.read_text()
    result = run(SimConfig(fabric=fabric, pairs=((0, 511), (17, 300)), bytes_per_flow=1 << 20))
    assert result.verified and all(f.complete for f in result.flows)
    assert min(result.per_plane_bytes) > 0  # every plane carried its share
    text = render.render(fabric, "linux", ["p7-t1p"])
    assert text.count("route replace") == 1 + fabric.racks  # its uN SID and one per T0
