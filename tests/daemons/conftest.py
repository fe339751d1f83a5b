"""Fixtures shared by the daemon tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiharness import Daemons


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    """Two fresh mrcds (h0, h3) in loopback data mode with API servers, for one test."""
    d = Daemons(tmp_path)
    try:
        yield d.start()
    finally:
        d.stop()
