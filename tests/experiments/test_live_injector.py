"""The live measurement applies a fault from a process of its own, not the measuring one."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from mrcstack.experiments.live import FaultCase, _Injector
from mrcstack.netns.faults import Faults


class _Armed:
    def __init__(self, fire: Callable[[], object]) -> None:
        self.fire = fire

    def cancel(self) -> None:
        pass


class _Deferring:
    """Stands in for the fault harness (the actions below do not use one): ``arm`` keeps
    the action for ``fire``, as the harness keeps the planned operations."""

    def __init__(self, on_arm: Callable[[], object] = lambda: None) -> None:
        self.on_arm = on_arm

    def arm(self, action: Callable[[Faults], object]) -> _Armed:
        self.on_arm()
        return _Armed(lambda: action(cast(Faults, self)))


def harness(on_arm: Callable[[], object] = lambda: None) -> Faults:
    return cast(Faults, _Deferring(on_arm))


def test_the_fault_runs_in_another_process_with_its_later_steps(tmp_path: Path) -> None:
    marks = tmp_path / "marks"

    def mark(what: str) -> None:
        with marks.open("a") as f:
            f.write(f"{what} {os.getpid()} {time.time()!r}\n")

    case = FaultCase("t", "t", lambda f: mark("apply"), later=((0.05, lambda f: mark("later")),))
    injector = _Injector(harness(lambda: mark("armed")), case)
    # Armed before the constructor returns; applied only at the fault time.
    assert not injector.started and marks.read_text().split()[0] == "armed"
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
    assert [w for w, _, _ in lines] == ["armed", "apply", "later"]
    assert all(int(pid) != os.getpid() for _, pid, _ in lines)
    assert 0 <= command_ms < 5000
    assert float(lines[2][2]) - injector.fault_at >= 0.05  # at its offset from the fault
    assert injector.join() == command_ms  # joined once, answered again
    [step_ms] = injector.steps_ms  # when the later step had finished, from the fault time
    assert step_ms >= 50 and step_ms >= (float(lines[2][2]) - injector.fault_at) * 1e3


def test_a_fault_that_fails_names_itself_and_an_unstarted_one_does_nothing(
    tmp_path: Path,
) -> None:
    def boom(f: Faults) -> None:
        raise OSError("no such port")

    failing = _Injector(harness(), FaultCase("nic", "nic", boom))
    failing.start()
    with pytest.raises(RuntimeError, match=r"fault nic: OSError: no such port"):
        failing.join()

    def refuse() -> None:
        raise ValueError("already down")

    with pytest.raises(RuntimeError, match=r"fault nic: ValueError: already down"):
        _Injector(harness(refuse), FaultCase("nic", "nic", boom))  # fails to arm: at once
    marker = tmp_path / "never"
    idle = _Injector(harness(), FaultCase("x", "x", lambda f: marker.write_text("x")))
    assert math.isnan(idle.join())  # the run ended before the fault time
    assert not marker.exists()
