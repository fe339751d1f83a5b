"""The mrcd command: config errors, --check, a real process serving metrics, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

MRCD = [sys.executable, "-m", "daemons.mrcd.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp: Path, extra: str = "") -> Path:
    psk = tmp / "cluster.key"
    psk.write_text(os.urandom(32).hex())
    cfg = tmp / "mrcd.toml"
    cfg.write_text(
        f"""
[mrcd]
host = 0
data_mode = "loopback"
data_port = {20000 + os.getpid() % 5000 * 4}
control_address = "[::1]:{free_port()}"
api_socket = "{tmp / "mrcd.sock"}"
{extra}
[mrcd.auth]
mode = "psk"
psk_file = "{psk}"
[fabric]
planes = 2
racks = 2
hosts_per_rack = 1
t1_per_plane = 2
"""
    )
    return cfg


@pytest.mark.parametrize(
    "body,message",
    [
        ("[mrcd]\nhost = 0\nplnes = 3\n", "mrcd.plnes: unknown key"),
        ("[mrcd]\nhost = 99\n", "mrcd.host: must be in"),
        ("[mrcd]\nhost = 0\n[fabric]\nplanes = 0\n", "fabric.planes"),
        ("[mrcd\n", "toml:"),
        ("[mrcd]\nhost = 0\nlog_level = 'loud'\n", "mrcd.log_level"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, body: str, message: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    proc = subprocess.run(
        [*MRCD, "--config", str(cfg)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_bad_flag_and_missing_file(tmp_path: Path) -> None:
    proc = subprocess.run([*MRCD, "--nope"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run(
        [*MRCD, "--config", str(tmp_path / "absent.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_check_validates_and_exits(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*MRCD, "--config", str(write_config(tmp_path)), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout


def test_daemon_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path)
    proc = subprocess.Popen(
        [*MRCD, "--config", str(cfg), f"--web.listen-address=127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert "mrc_planes 2.0" in body
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "event=stopping" in err and "event=stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
