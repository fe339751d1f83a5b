"""The live measurement applies a fault from a process of its own, not the measuring one."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import cast

import pytest

from mrcstack.experiments.live import FaultCase, _Injector
from mrcstack.netns.faults import Faults

NO_FAULTS = cast(Faults, None)  # the actions below do not use the harness


def test_the_fault_runs_in_another_process_with_its_later_steps(tmp_path: Path) -> None:
    marks = tmp_path / "marks"

    def mark(what: str) -> None:
        with marks.open("a") as f:
            f.write(f"{what} {os.getpid()} {time.time()!r}\n")

    case = FaultCase("t", "t", lambda f: mark("apply"), later=((0.05, lambda f: mark("later")),))
    injector = _Injector(NO_FAULTS, case)
    assert not injector.started and not marks.exists()  # waits for the fault time
    injector.start()
    deadline = time.monotonic() + 10
    while "later" not in (marks.read_text() if marks.exists() else ""):
        assert time.monotonic() < deadline, "the fault's steps did not run"
        time.sleep(0.01)
    time.sleep(0.05)
    # Done, it waits to be joined: its exit (tearing down a copy of this process) must not
    # fall inside the measured window.
    assert os.waitpid(injector._pid, os.WNOHANG) == (0, 0)
    command_ms = injector.join()
    lines = [line.split() for line in marks.read_text().splitlines()]
    assert [w for w, _, _ in lines] == ["apply", "later"]
    assert all(int(pid) != os.getpid() for _, pid, _ in lines)
    assert 0 <= command_ms < 5000
    assert float(lines[1][2]) - injector.fault_at >= 0.05  # at its offset from the fault
    assert injector.join() == command_ms  # joined once, answered again


def test_a_fault_that_fails_names_itself_and_an_unstarted_one_does_nothing(
    tmp_path: Path,
) -> None:
    def boom(f: Faults) -> None:
        raise OSError("no such port")

    failing = _Injector(NO_FAULTS, FaultCase("nic", "nic", boom))
    failing.start()
    with pytest.raises(RuntimeError, match=r"fault nic: OSError: no such port"):
        failing.join()
    marker = tmp_path / "never"
    idle = _Injector(NO_FAULTS, FaultCase("x", "x", lambda f: marker.write_text("x")))
    assert math.isnan(idle.join())  # the run ended before the fault time
    assert not marker.exists()
