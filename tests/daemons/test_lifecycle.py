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
    """This process, across 0.2 s of CPU spent in user space: its user time grew by most of
    it, and its user and system times are what ``os.times`` says, the total their sum (each
    to two clock ticks: the readings are moments apart); a PID above the kernel's limit,
    None."""
    before = lifecycle.process_times(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:  # (a CPU clock read is a system call: mostly sums)
        sum(range(20_000))
    times = lifecycle.process_times(os.getpid())
    own = os.times()
    assert before is not None and times is not None
    assert times[0] - before[0] >= 0.1  # (ticks are sampled: not all 0.2 s need show)
    slack = 2 / os.sysconf("SC_CLK_TCK")
    assert abs(times[0] - own.user) <= slack and abs(times[1] - own.system) <= slack
    total = lifecycle.process_cpu(os.getpid())
    assert total is not None and abs(total - sum(times)) <= slack
    assert lifecycle.process_times(2**22 + 1) is None and lifecycle.process_cpu(2**22 + 1) is None
