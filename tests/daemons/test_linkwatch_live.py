"""Link watching on a real veth pair (root): a namespace of our own, toggled by `ip`.

namespace tOPS-<random>:   vA <===== veth =====> vB
the watcher (python -m mrcstack.daemons.mrcd.datapath.linkwatch --json vA) runs inside
the namespace;
the test toggles vA (admin) and vB (the peer: vA loses carrier) and reads its lines.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time

import pytest

from tests.support import REPO

ROOT = REPO


STEP_TIMEOUT = 10.0  # hang protection only; the latency is printed, never asserted


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Watcher:
    """The CLI watcher inside the namespace; its JSON lines arrive on a queue."""

    def __init__(self, ns: str, ifnames: list[str]) -> None:
        argv = [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-m",
            "mrcstack.daemons.mrcd.datapath.linkwatch",
        ]
        self.proc = subprocess.Popen(
            [*argv, "--json", *ifnames],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def take(self, n: int) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        deadline = time.monotonic() + STEP_TIMEOUT
        while len(out) < n:
            try:
                out.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                done = self.proc.poll() is not None and self.proc.stderr is not None
                err = self.proc.stderr.read() if done and self.proc.stderr else ""
                raise AssertionError(f"wanted {n} lines, got {out}; {err}") from None
        return out

    def quiet(self, wait: float = 0.3) -> list[dict[str, object]]:
        time.sleep(wait)
        extra = []
        while not self.lines.empty():
            extra.append(self.lines.get_nowait())
        return extra

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.requires_root
@pytest.mark.requires_program("ip")
def test_veth_admin_and_carrier_changes_in_own_namespace() -> None:
    ns = f"tOPS-lw-{secrets.token_hex(3)}"
    watcher: Watcher | None = None
    ip("netns", "add", ns)
    try:
        ip("-n", ns, "link", "add", "vA", "type", "veth", "peer", "name", "vB")
        ip("-n", ns, "link", "set", "vA", "up")
        ip("-n", ns, "link", "set", "vB", "up")
        deadline = time.monotonic() + STEP_TIMEOUT
        while (
            "LOWER_UP"
            not in subprocess.run(
                ["ip", "-n", ns, "link", "show", "vA"], capture_output=True, text=True, check=True
            ).stdout
        ):
            assert time.monotonic() < deadline, "veth never got carrier"
            time.sleep(0.02)

        watcher = Watcher(ns, ["vA"])
        first = watcher.take(2)  # the initial dump, then "ready"
        assert first[0] == {"ifname": "vA", "up": True, "time": first[0]["time"]}
        assert first[1]["ready"] is True

        steps = [
            (("vA", "down"), False, "admin down"),
            (("vA", "up"), True, "admin up"),
            (("vB", "down"), False, "peer down (carrier lost)"),
            (("vB", "up"), True, "peer up (carrier back)"),
        ]
        latencies = []
        for (dev, state), want, label in steps:
            t0 = time.time()
            ip("-n", ns, "link", "set", dev, state)
            t1 = time.time()
            (event,) = watcher.take(1)
            assert (event["ifname"], event["up"]) == ("vA", want), label
            assert watcher.quiet() == [], f"{label}: more than one report"
            got = float(event["time"])  # type: ignore[arg-type]
            latencies.append((label, (got - t0) * 1e3, (got - t1) * 1e3))
        t0 = time.time()
        ip("-n", ns, "link", "del", "vA")
        (event,) = watcher.take(1)
        assert (event["ifname"], event["up"]) == ("vA", False)
        latencies.append(("deleted", (float(event["time"]) - t0) * 1e3, float("nan")))  # type: ignore[arg-type]

        print("\nlink-watch notification latency (ms): from `ip` start / from `ip` exit")
        for label, from_start, from_exit in latencies:
            print(f"  {label:28s} {from_start:7.2f}  {from_exit:7.2f}")
    finally:
        if watcher is not None:
            watcher.stop()
        for pid in subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, check=False
        ).stdout.split():
            os.kill(int(pid), 9)  # only processes inside our own namespace
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert ns not in listed.stdout
