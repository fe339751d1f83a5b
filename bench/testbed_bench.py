"""Testbed build and teardown times: the default fabric and examples/fabric-large.toml.

``run()`` builds and removes each fabric ``REPEAT`` times (testbed names ``tbd``/``tbl``,
removed by exact name in ``finally``) and returns the median seconds of each phase, plus
the large build's steps.  It needs root; without it, it returns an empty dict.
The large fabric is 8 planes, 4 racks x 4 hosts, 16 T1 per plane, every link shaped at
100 Gbit/s: 176 namespaces, 640 veth pairs, 1,280 tbf qdiscs.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from mrcstack.fabric import Fabric
from mrcstack.netns import testbed

REPEAT = 3
LARGE = Path(__file__).resolve().parent.parent / "examples" / "fabric-large.toml"


def _measure(fabric: Fabric, name: str, key: str, out: dict[str, float]) -> None:
    builds, downs = [], []
    steps: dict[str, list[float]] = {}
    testbed.clean(name)
    try:
        for _ in range(REPEAT):
            report = testbed.up(fabric, name)
            builds.append(report.seconds)
            for step, seconds in report.steps.items():
                steps.setdefault(step, []).append(seconds)
            start = time.perf_counter()
            testbed.down(name)
            downs.append(time.perf_counter() - start)
    finally:
        testbed.clean(name)
    out[f"{key}_build_s"] = statistics.median(builds)
    out[f"{key}_teardown_s"] = statistics.median(downs)
    out[f"{key}_namespaces"] = float(report.namespaces)
    out[f"{key}_links"] = float(report.links)
    if key == "large":
        for step, values in steps.items():
            out[f"{key}_step_{step}_s"] = statistics.median(values)


def run() -> dict[str, float]:
    if os.geteuid() != 0:
        return {}
    out: dict[str, float] = {}
    _measure(Fabric(), "tbd", "default", out)
    _measure(Fabric.load(LARGE), "tbl", "large", out)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<32} {v:10.3f}")
