"""The switch trimming program's configuration and build, without the kernel: its settings
round-trip through the BPF map's layout, bad values are refused naming the setting, and the
object is compiled once and again on demand.  tests/netns/test_trim.py runs it on the kernel.
"""

from __future__ import annotations

import pytest

from mrcstack.netns import trim


def test_config_round_trips_through_the_map_layout() -> None:
    cfg = trim.TrimConfig(
        rate_bps=20_000_000,
        trim_threshold_bytes=65536,
        ecn_threshold_bytes=16384,
        last_hop=True,
        probability=0.25,
        queue_bytes=1 << 20,
        ecn_any=True,
    )
    assert trim.TrimConfig.unpack(cfg.pack()) == cfg
    off = trim.TrimConfig(rate_bps=0, trim_threshold_bytes=0, enabled=False)
    assert trim.TrimConfig.unpack(off.pack()) == off
    assert off.mode == "off" and cfg.mode == "probability"


@pytest.mark.parametrize(
    "field, value",
    [
        ("rate_bps", -1),
        ("rate_bps", 10**12),
        ("trim_threshold_bytes", 1.5),
        ("probability", 1.5),
        ("probability", True),
        ("queue_bytes", 0),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    args: dict[str, object] = {"rate_bps": 1000, "trim_threshold_bytes": 1000, field: value}
    with pytest.raises(trim.TrimError, match=field):
        trim.TrimConfig(**args)  # type: ignore[arg-type]


@pytest.mark.skipif(trim.build_problem() is not None, reason=trim.build_problem() or "")
def test_build_is_cached_and_forced() -> None:
    obj = trim.build()
    mtime = obj.stat().st_mtime_ns
    assert trim.build() == obj and obj.stat().st_mtime_ns == mtime
    assert trim.build(force=True) == obj and obj.read_bytes()[:4] == b"\x7fELF"
