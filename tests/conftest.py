"""What every test can ask for: the testbed factory, and the markers that say what a test
needs from the machine.

- ``@pytest.mark.requires_root``: the test builds namespaces, opens raw sockets or attaches
  programs to the kernel; skipped, saying so, when not run as root.
- ``@pytest.mark.requires_kernel("sch_netem")``: skipped with the kernel's own words where
  the feature is missing (:data:`tests.support.kernel.FEATURES` lists the names).
- ``@pytest.mark.requires_program("tshark")``: skipped where the program is not installed.

Every test has a timeout (pyproject.toml; a longer one with ``@pytest.mark.timeout(s)``),
so a hang fails with a traceback instead of stalling the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support import kernel
from tests.support.testbeds import Testbeds


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "requires_root: needs root (namespaces, raw sockets, BPF)",
        "requires_kernel(feature): needs a kernel feature (tests/support/kernel.py)",
        "requires_program(name): needs a program on PATH",
    ):
        config.addinivalue_line("markers", line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip before any fixture runs, so a module's testbed is not built for nothing."""
    if item.get_closest_marker("requires_root") and os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, raw sockets, BPF)")
    for mark in item.iter_markers("requires_program"):
        (name,) = mark.args
        if shutil.which(name) is None:
            pytest.skip(f"{name} is not installed (make setup)")
    for mark in item.iter_markers("requires_kernel"):
        (feature,) = mark.args
        if (problem := kernel.problem(feature)) is not None:
            pytest.skip(problem)


@pytest.fixture(scope="module")
def testbeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbeds]:
    """The module's testbed factory: what it builds is removed when the module ends."""
    factory = Testbeds(tmp_path_factory.mktemp)
    try:
        yield factory
    finally:
        factory.close()
