"""The one way tests build a namespace testbed, with mrcd on its hosts when asked.

A test module asks the ``testbeds`` fixture (tests/conftest.py) for what it needs in a
module-scoped fixture of its own::

    @pytest.fixture(scope="module")
    def bed(testbeds: Testbeds) -> Bed:
        return testbeds.up("ts", Fabric(), cluster=True)

Every step's undo is registered before the step runs, so a build that fails halfway, a
test that fails, or a Ctrl-C still leaves nothing behind: when the module ends, the faults
are restored, the daemons stopped, and the testbed removed by its exact name; then the
factory checks that no namespace of it is left and that every daemon exited cleanly.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mrcstack.daemons.cluster import Cluster
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.faults import Faults
from mrcstack.netns.run import ip
from mrcstack.netns.state import TestbedState, exists, load
from tests.support import kernel
from tests.support.isolation import run_name


@dataclass
class Bed:
    """A built testbed: its recorded state, the fault harness on it (``log`` holds what the
    harness did), a work folder, and mrcd on its hosts when it was asked for."""

    name: str
    state: TestbedState
    faults: Faults
    workdir: Path
    cluster: Cluster | None = None
    log: list[str] = field(default_factory=list)

    def ns(self, host: int) -> str:
        """Host ``host``'s namespace."""
        return self.state.ns(f"h{host}")

    def alive(self) -> None:
        """Every daemon is still running (a test's side effects must not kill one)."""
        assert self.cluster is not None, f"testbed {self.name} was built without mrcd"
        for host, d in self.cluster.daemons.items():
            assert d.proc is not None and d.proc.poll() is None, (
                f"mrcd on h{host} died: {self.cluster.tail(host)}"
            )


def leftovers(name: str) -> list[str]:
    """Everything named for testbed ``name`` in `ip netns list` and root `ip link`."""
    spaces = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    links = [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link").splitlines()]
    return [n for n in spaces + links if n.startswith(f"{name}-")]


class Testbeds:
    """Builds testbeds for one test module and removes them all when it ends."""

    __test__ = False  # not a pytest test class

    def __init__(self, workdir: Callable[[str], Path]) -> None:
        self._workdir = workdir
        self._stack = contextlib.ExitStack()
        self._problems: list[str] = []

    def up(
        self,
        prefix: str,
        fabric: Fabric,
        *,
        cluster: bool = False,
        hosts: Sequence[int] | None = None,
        extra: str = "",
        clean_exit: bool = True,
        mapper: bool = False,
        mapper_extra: str = "",
    ) -> Bed:
        """A testbed named ``prefix`` plus random characters (runs in other worktrees or
        CI never share one), skipped with the reason where this machine cannot build it.

        ``cluster``: mrcd on ``hosts`` (all by default), ``extra`` more [mrcd] keys for
        each; ``clean_exit``: the daemons must exit 0 when stopped (False for modules that
        kill one on purpose); ``mapper``: mrcmapper too, and every mrcd's probing agent
        (``mapper_extra``: more [mrcmapper] keys)."""
        name = run_name(prefix)
        if (problem := kernel.problem("netns")) is not None:
            pytest.skip(problem)
        workdir = self._workdir(name)
        self._stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        self._stack.callback(self._remove, name)
        if exists(name):
            testbed.clean(name)  # a crashed run of the same name: start from nothing
        testbed.up(fabric, name)
        state = load(name)
        log: list[str] = []
        faults = Faults(state, log=log.append)
        bed = Bed(name, state, faults, workdir, log=log)
        if cluster:
            bed.cluster = Cluster(
                state,
                workdir,
                hosts=list(hosts) if hosts is not None else None,
                extra=extra,
                mapper=mapper,
                mapper_extra=mapper_extra,
            )
            self._stack.callback(self._stop, bed.cluster, clean_exit)
            bed.cluster.start()
        self._stack.callback(faults.restore_all)
        return bed

    def _stop(self, cluster: Cluster, clean_exit: bool) -> None:
        codes = cluster.stop()
        if clean_exit and any(code != 0 for code in codes.values()):
            self._problems.append(f"mrcd exit codes {codes}")

    def _remove(self, name: str) -> None:
        testbed.clean(name)
        if left := leftovers(name):
            self._problems.append(f"testbed {name} left {left}")

    def close(self) -> None:
        """Undo everything (last built first), then fail if anything was left behind."""
        self._stack.close()
        assert not self._problems, "; ".join(self._problems)
