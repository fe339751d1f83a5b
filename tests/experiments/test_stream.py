"""The TCP/MPTCP stream ends the live runs use: the sender says when it is connected, and
the run's clock starts there (an interpreter started in a namespace takes up to a second
on a busy machine; a clock started at the spawn measured a transfer that had not begun)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.isolation import run_name

NS = run_name("mst")


@pytest.fixture
def netns() -> Iterator[str]:
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        yield NS
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=True)


def stream(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "mrcstack.experiments.stream",
         "--proto", "tcp", "--timeout", "30", *args],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.requires_root  # a network namespace of its own, so only its loopback
def test_the_sender_reports_its_connection_before_any_data_counts(netns: str) -> None:
    recv = stream(netns, "--role", "recv")
    send = None
    try:
        assert recv.stdout is not None
        assert json.loads(recv.stdout.readline()) == {"ready": True}
        send = stream(netns, "--role", "send", "--to", "::1", "--seconds", "1.0")
        assert send.stdout is not None
        assert json.loads(send.stdout.readline()) == {"connected": True}
        rest, _ = send.communicate(timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        for proc in (send, recv):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert json.loads(rest) == {}  # and nothing else but its closing line
    per_ms = {int(ms) / 1000: n for ms, n in json.loads(out)["per_ms"].items()}
    assert sum(per_ms.values()) > 0
    # The sender's --seconds count from its connection: the data spans about that long
    # (a lower bound only: a busy machine may start the receiver's reads late).
    assert max(per_ms) - min(per_ms) >= 0.5
