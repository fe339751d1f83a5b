"""The fabric's TOML form, rate and size parsing, and configuration errors."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import pickle
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrcstack.errors import LocalError
from mrcstack.fabric import (
    MAX_HOSTS,
    Fabric,
    FabricConfigError,
    format_rate,
    format_size,
    parse_rate,
    parse_size,
)
from tests.support import REPO

EXAMPLES = REPO / "examples"


# Rates ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("100Gbit", 100e9),
        ("200mbit", 200e6),
        ("10G", 10e9),
        ("10g", 10e9),
        ("400000000", 400e6),
        ("400000000bit", 400e6),
        ("1.5gbit", 1.5e9),
        ("1.5gbps", 12e9),  # tc: "bps" is BYTES per second
        ("1Bps", 8.0),
        ("2kbit", 2000.0),
        ("1Kibit", 1024.0),
        ("1mibit", 2.0**20),
        ("1GiBps", 8 * 2.0**30),
        ("1tbit", 1e12),
        ("0.1gbit", 1e8),  # exact, not 1e8 + one ulp
        ("1e9", 1e9),
        (".5mbit", 5e5),
        (" 25 Mbit ", 25e6),
    ],
)
def test_parse_rate(text: str, bps: float) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    "text",
    ["", "fast", "10 gbitz", "-1gbit", "0", "0mbit", "inf", "nan", "1e400gbit", "1e9999", "1.2.3"],
)
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad rate") as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(text) in message
    assert "\n" not in message


@given(st.floats(min_value=1e-3, max_value=1e18, allow_nan=False, allow_infinity=False))
def test_format_rate_round_trips(bps: float) -> None:
    assert parse_rate(format_rate(bps)) == bps


@given(st.integers(min_value=1, max_value=1 << 53))  # exact as a float
def test_format_rate_round_trips_integers(bps: int) -> None:
    assert parse_rate(format_rate(bps)) == bps


def test_format_rate_picks_the_largest_exact_unit() -> None:
    assert format_rate(100e9) == "100gbit"
    assert format_rate(1.5e9) == "1500mbit"
    assert format_rate(1234.0) == "1234bit"
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            format_rate(bad)


# Sizes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64MiB", 64 << 20),
        ("1GiB", 1 << 30),
        ("4096", 4096),
        ("1MB", 1_000_000),
        ("1mb", 1_000_000),
        ("1kB", 1000),
        ("2KiB", 2048),
        ("1.5KiB", 1536),
        ("10b", 10),
        ("0", 0),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "x", "1.3B", "-1", "1kbit", "1M", -1, True, 1.5, None])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="bad size") as info:
        parse_size(text)  # type: ignore[arg-type]  # deliberately wrong types too
    assert "\n" not in str(info.value)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_format_size_round_trips(size: int) -> None:
    assert parse_size(format_size(size)) == size


def test_format_size_units() -> None:
    assert format_size(1 << 20) == "1MiB"
    assert format_size(3 << 10) == "3KiB"
    assert format_size(1000) == "1000"
    assert format_size(0) == "0"


# TOML -----------------------------------------------------------------------------------
rates = st.none() | st.floats(min_value=1.0, max_value=1e15) | st.integers(1, 10**15).map(float)


@st.composite
def fabrics(draw: st.DrawFn) -> Fabric:
    racks = draw(st.integers(1, 256))
    mtu = draw(st.integers(1280, 65535))
    return Fabric(
        planes=draw(st.integers(1, 16)),
        racks=racks,
        hosts_per_rack=draw(st.integers(1, MAX_HOSTS // racks)),
        t1_per_plane=draw(st.integers(1, 256)),
        host_link_bps=draw(rates),
        fabric_link_bps=draw(rates),
        mtu=mtu,
        queue_bytes=draw(st.integers(mtu, 1 << 34)),
        locator_block=str(ipaddress.IPv6Address(draw(st.integers(0, (1 << 32) - 1)) << 96)),
    )


@given(fabrics())
def test_toml_round_trip(fabric: Fabric) -> None:
    text = fabric.to_toml()
    assert Fabric.from_toml(text) == fabric
    assert set(tomllib.loads(text)) == {"fabric"}


def test_toml_of_the_default_fabric() -> None:
    text = Fabric().to_toml()
    assert "planes = 4\n" in text
    assert 'queue_bytes = "1MiB"\n' in text
    assert "host_link_bps =" not in text  # unshaped: left out, mentioned in a comment
    shaped = Fabric(host_link_bps=100e9).to_toml()
    assert 'host_link_bps = "100gbit"\n' in shaped


def test_toml_accepts_numbers_and_strings() -> None:
    fabric = Fabric.from_toml(
        "[fabric]\nplanes = 8\nhost_link_bps = 200000000\nfabric_link_bps = '1.5gbit'\n"
        "queue_bytes = '64KiB'\n"
    )
    assert fabric == Fabric(
        planes=8, host_link_bps=200e6, fabric_link_bps=1.5e9, queue_bytes=64 << 10
    )
    assert isinstance(fabric.host_link_bps, float)
    assert Fabric.from_toml("[fabric]\nqueue_bytes = 20000\n").queue_bytes == 20000
    assert Fabric.from_toml("[fabric]\n") == Fabric()


def test_load_examples() -> None:
    assert Fabric.load(EXAMPLES / "fabric-default.toml") == Fabric()
    large = Fabric.load(str(EXAMPLES / "fabric-large.toml"))
    assert (large.planes, large.racks, large.t1_per_plane) == (8, 4, 16)
    assert large.host_link_bps == large.fabric_link_bps == 100e9


def test_load_round_trip_and_errors(tmp_path: Path) -> None:
    fabric = Fabric(planes=2, racks=3, fabric_link_bps=5e6)
    path = tmp_path / "fabric.toml"
    path.write_text(fabric.to_toml())
    assert Fabric.load(path) == fabric
    path.write_bytes(b"[fabric]\nplanes = 2 # \xff\n")
    with pytest.raises(FabricConfigError, match=r"^toml: not UTF-8"):
        Fabric.load(path)
    with pytest.raises(OSError):
        Fabric.load(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[fabric]\nplanes = 0", "fabric.planes: must be in 1..16, got 0"),
        ("[fabric]\nplanes = 17", "fabric.planes: must be in 1..16, got 17"),
        ("[fabric]\nplnes = 1", "fabric.plnes: unknown key"),
        ("[fabric]\nracks = 257", "fabric.racks: must be in 1..256, got 257"),
        ("[fabric]\nt1_per_plane = 0", "fabric.t1_per_plane: must be in 1..256, got 0"),
        ("[fabric]\nhosts_per_rack = 0", "fabric.hosts_per_rack: must be in 1..2048, got 0"),
        (
            "[fabric]\nracks = 256\nhosts_per_rack = 9",
            "fabric.hosts_per_rack: racks*hosts_per_rack must be <= 2048, got 2304",
        ),
        ("[fabric]\nplanes = '4'", "fabric.planes: must be an integer, got '4' (str)"),
        ("[fabric]\nplanes = 4.0", "fabric.planes: must be an integer, got 4.0 (float)"),
        ("[fabric]\nmtu = true", "fabric.mtu: must be an integer, got True (bool)"),
        ("[fabric]\nmtu = 1000", "fabric.mtu: must be in 1280..65535, got 1000"),
        ("[fabric]\nhost_link_bps = 0", "fabric.host_link_bps: must be positive, got 0.0"),
        ("[fabric]\nhost_link_bps = -5.0", "fabric.host_link_bps: must be positive, got -5.0"),
        ("[fabric]\nfabric_link_bps = nan", "fabric.fabric_link_bps: must be positive, got nan"),
        ("[fabric]\nfabric_link_bps = inf", "fabric.fabric_link_bps: must be positive, got inf"),
        (
            "[fabric]\nhost_link_bps = 'fast'",
            "fabric.host_link_bps: bad rate 'fast': expected a number and a unit, "
            "like 100gbit, 200mbit, 10G or 1.5gbps",
        ),
        (
            "[fabric]\nfabric_link_bps = [1]",
            'fabric.fabric_link_bps: must be a rate like "100gbit", got [1] (list)',
        ),
        (
            "[fabric]\nqueue_bytes = 100",
            "fabric.queue_bytes: must hold at least one MTU (9000), got 100",
        ),
        (
            "[fabric]\nqueue_bytes = '1.5B'",
            "fabric.queue_bytes: bad size '1.5B': must be a whole, non-negative number of bytes",
        ),
        (
            "[fabric]\nqueue_bytes = 1.5",
            'fabric.queue_bytes: must be a size like "1MiB", got 1.5 (float)',
        ),
        (
            "[fabric]\nlocator_block = 'fcbb::zz'",
            "fabric.locator_block: not an IPv6 address: 'fcbb::zz'",
        ),
        (
            "[fabric]\nlocator_block = 'fcbb:bb00:1::'",
            "fabric.locator_block: must be a /32 block (only the first 32 bits set), "
            "got fcbb:bb00:1::",
        ),
        ("[fabric]\nlocator_block = 5", "fabric.locator_block: must be a string, got 5 (int)"),
        ("[fabric.extra]\nx = 1", "fabric.extra: unknown key"),
        ("[fabric]\n[sim]\nx = 1", "sim: unknown key (only a [fabric] table is read)"),
        ("planes = 4", "planes: unknown key (only a [fabric] table is read)"),
        ("", "fabric: missing [fabric] table"),
        ("fabric = 3", "fabric: must be a table, got 3 (int)"),
        ("[fabric\n", "toml: Expected ']' at the end of a table declaration (at line 1, column 8)"),
    ],
)
def test_toml_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(FabricConfigError) as info:
        Fabric.from_toml(text)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Fabric)])
def test_every_key_reports_a_wrong_type_by_name(field: str) -> None:
    with pytest.raises(FabricConfigError) as info:
        Fabric.from_toml(f"[fabric]\n{field} = {{}}\n")
    assert str(info.value).startswith(f"fabric.{field}: must be ")
    assert info.value.key == f"fabric.{field}"


def test_config_error_kinds_and_pickling() -> None:
    with pytest.raises(FabricConfigError) as info:
        Fabric(planes=0)
    error = info.value
    assert isinstance(error, ValueError)
    assert isinstance(error, LocalError)
    assert (error.key, error.problem) == ("fabric.planes", "must be in 1..16, got 0")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert copy.key == error.key


def test_fabric_helpers() -> None:
    fabric = Fabric(racks=3, hosts_per_rack=2)
    assert fabric.hosts == 6
    assert [fabric.rack_of(h) for h in range(6)] == [0, 0, 1, 1, 2, 2]
    assert fabric.block == 0xFCBB_BB00 << 96
    with pytest.raises(ValueError, match=r"host 6 out of range 0\.\.5"):
        fabric.rack_of(6)
    with pytest.raises(ValueError, match="plane 4 out of range"):
        fabric.check_plane(4)
    assert (Fabric.t0_name(1, 27), Fabric.t1_name(0, 2)) == ("p1-t0ab", "p0-t1c")
