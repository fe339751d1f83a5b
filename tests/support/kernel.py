"""What this machine's kernel can do, for ``@pytest.mark.requires_kernel(feature)``.

Each feature is tried once per test process, the way the product itself checks it (in a
throwaway namespace where it needs one), and a missing one gives the product's own one-line
reason, which becomes the skip's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from mrcstack.netns import testbed, trim
from mrcstack.netns.faults import netem
from mrcstack.netns.run import TestbedError
from tests.support.isolation import run_name


def _netns() -> str | None:
    """Namespaces, veth pairs and SRv6 uSID routes: what every testbed needs.  Only what the
    kernel lacks is a reason to skip; anything else (a missing or too old ``ip``) fails."""
    try:
        testbed.check_features(run_name("kf"))
    except TestbedError as exc:
        if "lacks" in str(exc):
            return str(exc)
        raise
    return None


def _netem() -> str | None:
    problem = netem.netem_problem(run_name("kn"))
    return None if problem is None else f"this kernel has no sch_netem (the netem qdisc): {problem}"


def _mptcp() -> str | None:
    enabled = Path("/proc/sys/net/mptcp/enabled")
    if not enabled.exists():
        return "this kernel has no MPTCP (no /proc/sys/net/mptcp)"
    return None if enabled.read_text().strip() == "1" else "MPTCP is disabled (net.mptcp.enabled)"


#: Feature name -> its check (None when present, else why not).
FEATURES: dict[str, Callable[[], str | None]] = {
    "netns": _netns,
    "sch_netem": _netem,
    "tc_bpf": trim.unavailable_reason,  # the switches' trimming program: built and attached
    "mptcp": _mptcp,
}


@functools.cache
def problem(feature: str) -> str | None:
    """Why ``feature`` is missing here (None when present); root is checked first."""
    if feature not in FEATURES:
        raise KeyError(f"unknown kernel feature {feature!r}: one of {sorted(FEATURES)}")
    if os.geteuid() != 0:
        return f"needs root to check for {feature}"
    return FEATURES[feature]()
