"""The README's and docs' examples cannot rot: every ``console`` block is run exactly as
written (from the repository's top folder, the ``.venv/bin`` prefix included) and must
print what the block quotes, byte for byte (the commands quoted this way are deterministic:
the simulator, the address plan, ``render``), and the prose right after a simulator example
quotes no figure the example does not show.  Pasted commands need no ``sudo``: the docs are
for root, as the testbed is."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import REPO
from tests.support.docs import DOCS, Example, blocks, examples, unquoted_figures

EXAMPLES = examples()


def test_the_docs_have_examples_to_check() -> None:
    where = {e.block.path.name for e in EXAMPLES}
    assert "README.md" in where
    assert any("mrcstack.sim" in e.command for e in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.block.where for e in EXAMPLES])
def test_a_console_example_prints_what_it_quotes(example: Example) -> None:
    done = subprocess.run(
        ["bash", "-c", example.command], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{example.block.where}: {done.stderr}"
    printed = [line.rstrip() for line in done.stdout.rstrip("\n").splitlines()]
    quoted = [line.rstrip() for line in example.output.splitlines()]
    assert printed == quoted, f"{example.block.where}: the docs quote another output"
    if "mrcstack.sim" in example.command:
        assert unquoted_figures(example) == [], f"{example.block.where}: stale figures"


def test_no_pasted_command_needs_sudo() -> None:
    """Commands in the docs run as root (the testbed needs it) and paste as they are."""
    found = [
        f"{block.where}: {line}"
        for path in DOCS
        for block in blocks(path)
        if block.lang in ("sh", "console")
        for line in block.lines
        if line.lstrip("$ ").startswith("sudo ")
    ]
    assert found == []
