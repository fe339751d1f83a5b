"""What both daemons do alike once started (``mrcstack.daemons.lifecycle``)."""

from __future__ import annotations

import gc
import os
import time

from mrcstack.daemons import lifecycle


def test_settling_leaves_what_start_up_built_out_of_full_collections() -> None:
    """After :func:`lifecycle.settle` a full collection walks only what came after it: the
    start-up's objects (here a thousand lists) are in the permanent generation."""
    built = [[i] for i in range(1000)]
    frozen = gc.get_freeze_count()
    try:
        lifecycle.settle()
        assert gc.get_freeze_count() >= frozen + len(built)
        assert not any(o is built for o in gc.get_objects(generation=2))
        later: list[list[int]] = [[1]]
        gc.collect(1)  # (its survivors move up to the oldest generation)
        assert any(o is later for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()  # (this process is the test runner, not a daemon)


def test_a_process_cpu_time_reads_as_user_and_system_and_none_once_gone() -> None:
    """This process, after a busy moment in user space: its user and system times are what
    ``os.times`` says, and the total is their sum (each to two clock ticks: the readings are
    moments apart); a PID above the kernel's limit, None."""
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    times = lifecycle.process_times(os.getpid())
    own = os.times()
    assert times is not None
    slack = 2 / os.sysconf("SC_CLK_TCK")
    assert own.user >= 0.05 - slack
    assert abs(times[0] - own.user) <= slack and abs(times[1] - own.system) <= slack
    total = lifecycle.process_cpu(os.getpid())
    assert total is not None and abs(total - sum(times)) <= slack
    assert lifecycle.process_times(2**22 + 1) is None and lifecycle.process_cpu(2**22 + 1) is None
