"""Helpers shared by the tests.  Test modules import from here, never from each other."""

from pathlib import Path

#: The repository's top folder (a checkout: README.md, docs/, examples/ ...).
REPO = Path(__file__).resolve().parents[2]
