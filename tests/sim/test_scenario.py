"""Scenario files (mrcstack.sim.scenario): exact round trip, the shipped examples, the CLI's
--scenario and --dump-scenario, and one-line errors that name the key at fault."""

from __future__ import annotations

import dataclasses
import fnmatch
import gzip
import json
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mrcstack
from mrcstack import cli as top_cli
from mrcstack.addrplan import ev_value
from mrcstack.core.cc import REGISTRY, CCParams
from mrcstack.core.config import MODES
from mrcstack.fabric import Fabric, letters
from mrcstack.sim import cli, run
from mrcstack.sim.collectives import KINDS, ring_steps
from mrcstack.sim.config import (
    FlowSpec,
    LinkFailure,
    LossChange,
    NicDown,
    PlaneFailure,
    SimConfig,
    SwitchFailure,
)
from mrcstack.sim.scenario import (
    FIELDS,
    ScenarioError,
    dumps,
    format_time,
    load,
    loads,
    parse_time,
)
from tests.support import REPO

ROOT = REPO
SHIPPED = Path(mrcstack.__file__).parent / "examples" / "scenarios"
EXAMPLES = ("incast.toml", "ring-allreduce.toml", "plane-failure.toml")


# Random valid SimConfigs ------------------------------------------------------------------
times = st.floats(min_value=0, max_value=1e-2, allow_nan=False)
probabilities = st.floats(min_value=0, max_value=1)
rates = st.one_of(st.sampled_from([10e9, 100e9, 2.5e9]), st.floats(1e6, 1e12))
labels = st.text(max_size=8)


@st.composite
def fabrics(draw: st.DrawFn) -> Fabric:
    racks = draw(st.integers(1, 3))
    mtu = draw(st.integers(1280, 9000))
    return Fabric(
        planes=draw(st.integers(1, 4)),
        racks=racks,
        hosts_per_rack=draw(st.integers(2 if racks == 1 else 1, 3)),
        t1_per_plane=draw(st.integers(1, 4)),
        host_link_bps=draw(st.none() | rates),
        fabric_link_bps=draw(st.none() | rates),
        mtu=mtu,
        queue_bytes=draw(st.integers(mtu, 4 << 20)),
        sid_format=draw(st.sampled_from(["usid", "classic"])),
    )


def link_names(f: Fabric) -> list[str]:
    up = [f"p{p}:t0{letters(r)}-t1{letters(t)}" for p in range(f.planes)
          for r in range(f.racks) for t in range(f.t1_per_plane)]  # fmt: skip
    down = [f"p{p}:h{h}-t0{letters(f.rack_of(h))}" for p in range(f.planes) for h in range(f.hosts)]
    return up + down


def switch_names(f: Fabric) -> list[str]:
    return [f"p{p}-t0{letters(r)}" for p in range(f.planes) for r in range(f.racks)] + [
        f"p{p}-t1{letters(t)}" for p in range(f.planes) for t in range(f.t1_per_plane)
    ]


@st.composite
def windows(draw: st.DrawFn) -> tuple[float, float | None]:
    start = draw(times)
    end = draw(st.none() | st.floats(min_value=start, max_value=1.0, exclude_min=True))
    return start, end


@st.composite
def host_pairs(draw: st.DrawFn, hosts: int) -> tuple[int, int]:
    src = draw(st.integers(0, hosts - 1))
    dst = draw(st.integers(0, hosts - 2))
    return src, dst + (dst >= src)


@st.composite
def flow_specs(draw: st.DrawFn, f: Fabric) -> tuple[FlowSpec, ...]:
    specs = []
    for index in range(draw(st.integers(1, 5))):
        src, dst = draw(host_pairs(f.hosts))
        evs = draw(
            st.lists(
                st.builds(
                    ev_value,
                    st.integers(0, f.planes - 1),
                    st.integers(0, f.t1_per_plane - 1),
                    st.integers(0, (1 << 20) - 1),
                ),
                max_size=3,
            )
        )
        planes = draw(st.lists(st.integers(0, f.planes - 1), max_size=3))
        if evs and planes:
            planes.append((evs[0] >> 8) & 0xF)
        specs.append(
            FlowSpec(
                src,
                dst,
                bytes=draw(st.none() | st.integers(1, 1 << 40)),
                start_s=draw(times),
                after=tuple(draw(st.lists(st.integers(0, index - 1), max_size=3))) if index else (),
                evs=tuple(evs),
                planes=tuple(planes),
                group=draw(labels),
            )
        )
    return tuple(specs)


@st.composite
def cc_params(draw: st.DrawFn) -> CCParams:
    max_cwnd = draw(st.integers(1, 1 << 30))
    low = draw(st.none() | st.integers(1, max_cwnd))
    return CCParams(
        base_rtt=draw(st.floats(1e-9, 1.0)),
        target_delay=draw(st.none() | st.floats(1e-9, 1.0)),
        max_cwnd=max_cwnd,
        adjust_bytes_threshold=draw(st.none() | st.integers(1, 1 << 30)),
        adjust_period_threshold=draw(st.none() | st.floats(1e-9, 1.0)),
        qa_gate=draw(st.integers(0, 10)),
        qa_threshold=draw(st.none() | st.floats(1e-9, 1.0)),
        disable_qa=draw(st.booleans()),
        initial_cwnd=draw(st.none() | st.integers(low or 1, max_cwnd)),
        min_cwnd=low,
    )


@st.composite
def sim_configs(draw: st.DrawFn) -> SimConfig:
    f = draw(fabrics())
    links = link_names(f)
    shape = draw(st.sampled_from(["default", "pairs", "specs"]))
    pairs = tuple(draw(st.lists(host_pairs(f.hosts), min_size=1, max_size=4)))
    specs = draw(flow_specs(f))
    flows = {"default": 1, "pairs": len(pairs), "specs": len(specs)}[shape]
    queue = draw(st.none() | st.integers(1, 4 << 20))
    effective = queue or f.queue_bytes
    kmin = draw(st.none() | st.integers(1, effective))
    max_time = draw(st.floats(1e-6, 10.0))
    kw = {
        "fabric": f,
        "pairs": pairs if shape == "pairs" else (),
        "flow_specs": specs if shape == "specs" else (),
        "bytes_per_flow": draw(st.integers(1, 1 << 34)),
        "wr_size": draw(st.none() | st.integers(1, 1 << 24)),
        "mode": draw(st.sampled_from(MODES)),
        "cc": draw(st.sampled_from(sorted(REGISTRY))),
        "cc_params": draw(st.none() | cc_params()),
        "link_delay_s": draw(times),
        "rate_bps": draw(rates),
        "queue_bytes": queue,
        "trim": draw(st.booleans()),
        "trim_threshold_bytes": draw(st.none() | st.integers(1, effective)),
        "ecn_kmin_bytes": kmin,
        "ecn_kmax_bytes": draw(st.none() | st.integers((kmin or effective // 16) + 1, 1 << 23)),
        "loss": draw(probabilities),
        "link_loss": tuple(
            draw(st.lists(st.tuples(st.sampled_from(links), probabilities), max_size=3))
        ),
        "ev_loss": tuple(
            draw(st.lists(st.tuples(st.integers(0, (1 << 32) - 1), probabilities), max_size=3))
        ),
        "link_failures": tuple(
            LinkFailure(draw(st.sampled_from(links)), *draw(windows()))
            for _ in range(draw(st.integers(0, 2)))
        ),
        "switch_failures": tuple(
            SwitchFailure(draw(st.sampled_from(switch_names(f))), *draw(windows()))
            for _ in range(draw(st.integers(0, 2)))
        ),
        "nic_downs": tuple(
            NicDown(
                draw(st.integers(0, f.hosts - 1)),
                draw(st.integers(0, f.planes - 1)),
                *draw(windows()),
            )
            for _ in range(draw(st.integers(0, 2)))
        ),
        "plane_failures": tuple(
            PlaneFailure(draw(st.integers(0, f.planes - 1)), *draw(windows()))
            for _ in range(draw(st.integers(0, 2)))
        ),
        "loss_changes": tuple(
            LossChange(draw(times), draw(probabilities), draw(st.none() | st.sampled_from(links)))
            for _ in range(draw(st.integers(0, 2)))
        ),
        "ecn_last_hop": draw(st.booleans()),
        "packet_latency_every": draw(st.integers(0, 100)),
        "mtu_payload": draw(st.integers(1, f.mtu - 200)),
        "ev_count": draw(st.integers(1, 1 << 16)),
        "seed": draw(st.integers(-(1 << 63), (1 << 63) - 1)),
        "max_sim_time_s": max_time,
        "series_interval_s": draw(st.none() | st.floats(max_time / 1e7, 1.0)),
        "latency_flows": tuple(draw(st.lists(st.integers(0, flows - 1), max_size=2))),
        "latency_writes": draw(st.integers(1, 1000)),
        "latency_write_bytes": draw(st.integers(1, 1 << 20)),
    }
    try:
        return SimConfig(**kw)  # type: ignore[arg-type]
    except ValueError:
        assume(False)
        raise


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_configs())
def test_round_trip_is_exact(cfg: SimConfig) -> None:
    text = dumps(cfg)
    assert loads(text) == cfg
    assert dumps(loads(text)) == text


@given(st.floats(min_value=0, max_value=1e6))
def test_format_time_is_exact(seconds: float) -> None:
    text = format_time(seconds)
    assert text is None or parse_time(text) == seconds


def test_times_parse_exactly() -> None:
    assert parse_time("5us") == 5e-6 and parse_time("0.1ms") == 1e-4
    assert [format_time(t) for t in (5e-6, 1e-4, 2e-3, 1.0, 0.0)] == [
        "5us", "0.1ms", "2ms", "1s", "0s"
    ]  # fmt: skip


def test_every_field_has_a_key() -> None:
    assert set(FIELDS.values()) == {f.name for f in dataclasses.fields(SimConfig)}
    cc = CCParams(
        target_delay=1e-5,
        adjust_bytes_threshold=8192,
        adjust_period_threshold=1e-5,
        qa_threshold=4e-5,
        initial_cwnd=4096,
        min_cwnd=4096,
    )
    text = dumps(SimConfig(cc_params=cc))
    for field in dataclasses.fields(CCParams):
        assert f"\n{field.name} = " in text, field.name
    assert loads(text).cc_params == cc


def test_units_and_alternative_forms() -> None:
    cfg = loads(
        """
        bytes = 1000
        rate = 2.5e9
        delay = 2e-6
        max_time = "0.5s"
        pairs = [[0, 3], "1:2"]
        link_loss = [["p0:t0a-t1c", 0.01], ["p0:t0a-t1c", 0.02]]
        ev_loss = [[0x102, 0.2]]
        [[fail_link]]
        link = "p0:t0a-t1c"
        start = 0
        """
    )
    assert (cfg.bytes_per_flow, cfg.rate_bps, cfg.link_delay_s) == (1000, 2.5e9, 2e-6)
    assert cfg.max_sim_time_s == 0.5 and cfg.pairs == ((0, 3), (1, 2))
    assert cfg.link_loss == (("p0:t0a-t1c", 0.01), ("p0:t0a-t1c", 0.02))
    assert cfg.ev_loss == ((0x102, 0.2),)
    assert cfg.link_failures == (LinkFailure("p0:t0a-t1c", 0.0, None),)
    assert loads(dumps(cfg)) == cfg  # the repeated link is written as a list
    assert loads("[ev_loss]\n0x102 = 0.2\n258 = 0.1\n").ev_loss == ((258, 0.2), (258, 0.1))
    assert loads("") == SimConfig()


# Collectives ------------------------------------------------------------------------------
def test_a_collective_expands_to_ring_steps_after_the_flows() -> None:
    cfg = loads(
        """
        [fabric]
        racks = 2
        hosts_per_rack = 3
        [[flow]]
        src = 0
        dst = 5
        [[flow]]
        src = 1
        dst = 4
        after = [0]
        [[collective]]
        kind = "allgather"
        hosts = [0, 2, 3]
        chunk = "64KiB"
        start = "1ms"
        name = "ag"
        [[collective]]
        kind = "ring-allreduce"
        chunk = 4096
        """
    )
    first = ring_steps("allgather", [0, 2, 3], 65536, first_index=2, start_s=1e-3, name="ag")
    second = ring_steps("ring-allreduce", range(6), 4096, first_index=2 + len(first))
    assert cfg.flow_specs == (FlowSpec(0, 5), FlowSpec(1, 4, after=(0,)), *first, *second)
    assert loads(dumps(cfg)) == cfg  # written as the flows it expanded to


@pytest.mark.parametrize("kind", KINDS)
def test_every_collective_kind_is_accepted(kind: str) -> None:
    cfg = loads(f'[[collective]]\nkind = "{kind}"\nchunk = 1\n')
    assert cfg.flow_specs == ring_steps(kind, range(4), 1)


# Shipped examples -------------------------------------------------------------------------
def test_the_shipped_examples_are_package_data() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["mrcstack"]
    for name in EXAMPLES:
        assert (SHIPPED / name).is_file()
        assert any(fnmatch.fnmatch(f"examples/scenarios/{name}", g) for g in globs), name


@pytest.mark.parametrize("name", EXAMPLES)
def test_shipped_example_runs_and_verifies(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mrcstack.core.connection")
    assert cli.main(["--scenario", str(SHIPPED / name), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verified"] is True
    assert out["config"]["fabric"]["host_link_bps"] is None and out["config"]["rate_bps"] == 10e9


def test_shipped_examples_say_what_they_promise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # found by name from any directory
    incast = load("incast.toml")
    assert {s.dst for s in incast.specs()} == {0} and len(incast.specs()) == 7
    assert incast.trim and not incast.ecn_last_hop
    ring = load("examples/scenarios/ring-allreduce.toml")
    assert ring.fabric.hosts == 8
    assert ring.flow_specs == ring_steps("ring-allreduce", range(8), 256 << 10, name="allreduce")
    assert ring.loss_changes == (LossChange(1e-3, 0.01),)
    failure = load("scenarios/plane-failure.toml")
    assert failure.plane_failures and failure.plane_failures[0].end is not None
    assert sorted(d for _, d in failure.flows()) == list(range(8))
    with pytest.raises(FileNotFoundError):
        load("no-such-scenario.toml")


def toml_blocks(path: Path) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", path.read_text(), re.S)


def test_the_documented_examples_load_and_the_full_one_runs() -> None:
    pytest.importorskip("mrcstack.core.connection")
    [full] = toml_blocks(ROOT / "docs" / "scenario.md")
    cfg = loads(full)
    assert len(cfg.flow_specs) == 14 and cfg.latency_flows == (1,)
    assert run(cfg).verified
    [short] = [b for b in toml_blocks(ROOT / "README.md") if "fail_plane" in b]
    assert loads(short).plane_failures == (PlaneFailure(2, 1e-4, 3e-4),)


def test_a_fabric_file_is_found_beside_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fab.toml").write_text(Fabric(planes=2, t1_per_plane=3).to_toml())
    (tmp_path / "s.toml").write_text('fabric = "fab.toml"\n')
    monkeypatch.chdir("/")
    assert load(tmp_path / "s.toml").fabric == Fabric(planes=2, t1_per_plane=3)
    assert loads('fabric = "fabric-large.toml"').fabric.planes == 8  # a shipped fabric


# The command line -------------------------------------------------------------------------
def dump(capsys: pytest.CaptureFixture[str], *argv: str) -> SimConfig:
    assert cli.main([*argv, "--dump-scenario"]) == 0
    return loads(capsys.readouterr().out)


def test_without_a_scenario_the_flags_keep_their_defaults() -> None:
    assert cli.config_from_args(cli.build_parser().parse_args([])) == SimConfig()


def test_flags_given_override_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'seed = 1\nbytes = "1MiB"\nqueue = "256KiB"\ntrim = false\n'
        "[[flow]]\nsrc = 0\ndst = 3\n"
        '[[fail_link]]\nlink = "p0:t0a-t1a"\nstart = "1ms"\n'
    )
    from_file = load(path)
    assert dump(capsys, "--scenario", str(path)) == from_file
    assert dump(capsys, "--scenario", str(path), "--seed", "5") == dataclasses.replace(
        from_file, seed=5
    )
    cfg = dump(
        capsys, "--scenario", str(path), "--pairs", "1:2", "--trim", "--queue", "2MiB",
        "--fail-link", "p1:t0b-t1a@2ms", "--rate", "10gbit",
    )  # fmt: skip
    assert cfg.pairs == ((1, 2),) and cfg.flow_specs == () and cfg.trim
    assert cfg.queue_bytes is None and cfg.fabric.queue_bytes == 2 << 20
    assert cfg.link_failures == (LinkFailure("p1:t0b-t1a", 2e-3),)
    assert cfg.fabric.host_link_bps == cfg.fabric.fabric_link_bps == 10e9
    assert (cfg.seed, cfg.bytes_per_flow) == (1, 1 << 20)


def test_dump_scenario_of_any_command_line_loads_back_equal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "--planes", "2", "--t1", "3", "--rate", "25gbit", "--delay", "3us", "--bytes", "3MiB",
        "--wr-size", "64KiB", "--pairs", "0:3,2:1", "--mode", "roce", "--cc", "fixed",
        "--loss", "0.01", "--link-loss", "p0:t0a-t1c=0.1", "--ev-loss", "0x102=0.2",
        "--fail-switch", "p1-t1a@1ms-2ms", "--nic-down", "h3:p1@0.5ms", "--seed", "9",
        "--series", "10us", "--max-time", "20ms", "--ecn-threshold", "64KiB:256KiB",
        "--trim-threshold", "512KiB", "--no-trim", "--ev-count", "16",
    ]  # fmt: skip
    expected = cli.config_from_args(cli.build_parser().parse_args(argv))
    assert dump(capsys, *argv) == expected


def test_mrcstack_sim_forwards_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SHIPPED / "incast.toml")
    assert top_cli.main(["sim", "--scenario", path, "--dump-scenario"]) == 0
    assert loads(capsys.readouterr().out) == load(path)


# Errors -----------------------------------------------------------------------------------
FLOW = "[[flow]]\nsrc = 0\ndst = 1\n"
BAD = [
    ("bytes = ", "toml: "),
    ("byte = 3", "byte: unknown key (did you mean 'bytes'?)"),
    (FLOW + "color = 1", "flow[0].color: unknown key"),
    ('seed = "x"', "seed: must be an integer"),
    ("trim = 1", "trim: must be true or false"),
    ('bytes = "lots"', "bytes: bad size"),
    ('rate = "fast"', "rate: bad rate"),
    ("rate = 0", "rate: must be a positive"),
    ('delay = "3 parsecs"', "delay: bad time"),
    ("loss = 2", "loss: must be a probability"),
    ('mode = "tcp"', "mode must be one of"),
    ('trim_threshold = "4MiB"', "trim threshold 4194304 exceeds"),
    ("flow = 3", "flow: must be an array of tables"),
    ("fail_link = [1]", "fail_link[0]: must be a table"),
    ('[[fail_link]]\nlink = "p0:t0a-t1a"\nstart = "1 parsec"', "fail_link[0].start: bad time"),
    ("[[fail_link]]\nstart = 0", "fail_link[0].link: missing"),
    ('[[fail_link]]\nlink = "p0:t0a-t1z"\nstart = 0', "fail_link[0].link: p0:t0a-t1z"),
    ('[[fail_switch]]\nswitch = "p0-t1a"\nstart = "2ms"\nend = "1ms"', "fail_switch[0]: bad"),
    ('[[fail_switch]]\nswitch = "h0"\nstart = 0', "fail_switch[0]: h0 is a host"),
    ("[[nic_down]]\nhost = 9\nplane = 0\nstart = 0", "nic_down[0]: host 9"),
    ("[[fail_plane]]\nplane = 7\nstart = 0", "fail_plane[0]: plane 7"),
    ('[[loss_change]]\nat = "1ms"\nloss = 2', "loss_change[0].loss: must be a probability"),
    (FLOW + "after = [0]", "flow[0].after[0]: flow 0 is not an earlier flow"),
    (FLOW + 'after = ["x"]', "flow[0].after[0]: must be an integer"),
    ("[[flow]]\nsrc = 9\ndst = 1", "flow[0].src: host 9 not in 0..3"),
    ("[[flow]]\nsrc = 1\ndst = 1", "flow[0].dst: a flow needs two different hosts"),
    ("[[flow]]\ndst = 1", "flow[0].src: missing"),
    (FLOW + "bytes = 0", "flow[0].bytes: must be >= 1"),
    (FLOW + "planes = [4]", "flow[0].planes[0]: plane 4"),
    (FLOW + "evs = [0x900]", "flow 0 (0:1): EV 0x900 names no path"),
    ('pairs = ["0-3"]', 'pairs[0]: must be "SRC:DST"'),
    ('pairs = ["0:3"]\n' + FLOW, "pairs: give pairs or"),
    ('[[collective]]\nkind = "tree"\nchunk = 1', "collective[0].kind: unknown collective"),
    ('[[collective]]\nkind = "allgather"\nchunk = 1\nhosts = [0, 0]', "collective[0].hosts:"),
    ('[[collective]]\nkind = "allgather"\nchunk = 1\nhosts = [0, 9]', "collective[0].hosts[1]"),
    ('[[collective]]\nkind = "allgather"', "collective[0].chunk: missing"),
    ('link_loss = { "p0:t0a-t1z" = 0.1 }', "link_loss[0]: p0:t0a-t1z"),
    ('link_loss = { "p0:t0a-t1a" = 1.5 }', "link_loss.p0:t0a-t1a: must be a probability"),
    ("[ev_loss]\nzz = 0.1", "ev_loss.zz: not an EV number"),
    ("ev_loss = [[1, 2, 3]]", "ev_loss[0]: must be [EV, P]"),
    ("[fabric]\nplanes = 0", "fabric.planes: must be in 1..16"),
    ("[fabric]\nplane = 2", "fabric.plane: unknown key"),
    ('fabric = "/nonexistent/f.toml"', "fabric: cannot read"),
    ("[cc_params]\nmax_cwnd = 0", "cc_params: max_cwnd must be an int >= 1"),
    ("[cc_params]\nfoo = 0", "cc_params.foo: unknown key"),
    ("latency_flows = [3]", "latency_flows[0]: 3 is not a flow (0..0)"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_input_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        loads(text)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_file_exits_2_with_one_line(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert cli.main(["--scenario", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1
    assert captured.err.startswith(f"mrcstack-sim: error: {path}: {message}"), captured.err


def test_unreadable_or_binary_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ScenarioError, match=r"bin\.toml: toml: not UTF-8"):
        load(path)
    assert cli.main(["--scenario", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.toml" in err


def test_a_gzipped_scenario_reads_like_the_plain_one(tmp_path: Path) -> None:
    cfg = SimConfig(
        fabric=Fabric(racks=2, hosts_per_rack=4),
        flow_specs=ring_steps("ring-allreduce", range(8), 4096),
    )
    packed = tmp_path / "allreduce.toml.gz"
    packed.write_bytes(gzip.compress(dumps(cfg).encode(), mtime=0))
    assert load(packed) == cfg
    broken = tmp_path / "broken.toml.gz"
    broken.write_bytes(gzip.compress(dumps(cfg).encode())[:40])
    with pytest.raises(ScenarioError, match=r"broken\.toml\.gz: gzip"):
        load(broken)
