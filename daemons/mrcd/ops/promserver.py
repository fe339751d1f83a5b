"""Run a real Prometheus server (Debian's ``prometheus``) against mrcd exporters.

For tests (loopback, and the testbed's management network) and ``mrcstack demo
--prometheus``: each server gets its own config, TSDB directory, log and port, and is
stopped by whoever started it (:func:`run_prometheus` does it in ``finally``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from mrcstack.daemons.mrcd.ops.metrics import parse_listen_address


class PrometheusError(RuntimeError):
    """The Prometheus server could not be started or queried."""


def prometheus_config(
    targets: Sequence[str], scrape_interval: float = 1.0, comment: str = ""
) -> str:
    """A prometheus.yml scraping mrcd at ``targets`` ("host:port", "[v6]:port"), opening
    with ``comment`` (each line as a ``#`` comment)."""
    if not targets:
        raise ValueError("prometheus needs at least one scrape target")
    for target in targets:
        if not parse_listen_address(target)[0]:
            raise ValueError(f"scrape target {target!r} needs a host")
    interval = f"{max(1, round(scrape_interval * 1000))}ms"
    listed = "\n".join(f"          - {json.dumps(t)}" for t in targets)
    head = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines())
    return (
        head + "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        "  - job_name: mrcd\n"
        f"    scrape_timeout: {interval}\n"
        "    static_configs:\n"
        "      - targets:\n"
        f"{listed}\n"
    )


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """A running ``prometheus`` process with its own config and data directory."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, datadir: Path) -> None:
        self.proc = proc
        self.url = url  # e.g. http://127.0.0.1:PORT
        self.datadir = datadir

    def api(self, path: str, **params: str) -> object:
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                reply = json.load(resp)
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"prometheus API {path}: {exc}") from None
        if not isinstance(reply, dict) or reply.get("status") != "success":
            raise PrometheusError(f"prometheus API {path}: {reply!r}")
        return reply.get("data")

    def query(self, expr: str) -> list[dict[str, object]]:
        """An instant query; the vector's samples (``metric`` labels, ``value``)."""
        data = self.api("query", query=expr)
        result = data.get("result") if isinstance(data, dict) else None
        return list(result) if isinstance(result, list) else []

    def targets(self) -> list[dict[str, object]]:
        data = self.api("targets")
        active = data.get("activeTargets") if isinstance(data, dict) else None
        return list(active) if isinstance(active, list) else []

    def wait_for(self, expr: str, timeout: float = 30.0, count: int = 1) -> list[dict[str, object]]:
        """Poll ``expr`` until it returns at least ``count`` samples."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if len(result) >= count:
                return result
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise PrometheusError(
                    f"{expr!r} gave {len(result)} samples, wanted {count}; targets: "
                    + ", ".join(f"{t.get('scrapeUrl')}={t.get('health')}" for t in self.targets())
                )
            time.sleep(0.25)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_prometheus(
    targets: Sequence[str],
    datadir: str | Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    scrape_interval: float = 1.0,
    binary: str = "prometheus",
    ready_timeout: float = 30.0,
    comment: str = "",
) -> PrometheusServer:
    """Start Prometheus on ``host:port`` (0: a free port) scraping ``targets``; its config
    (:func:`prometheus_config`, opening with ``comment``), TSDB and log live in ``datadir``.
    The caller stops it (or see :func:`run_prometheus`)."""
    exe = shutil.which(binary)
    if exe is None:
        raise PrometheusError(
            f"{binary} not found (Debian: apt-get install prometheus, which includes promtool)"
        )
    datadir = Path(datadir)
    datadir.mkdir(parents=True, exist_ok=True)
    config = datadir / "prometheus.yml"
    config.write_text(prometheus_config(targets, scrape_interval, comment))
    port = port or free_tcp_port(host)
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with (datadir / "prometheus.log").open("ab") as logfile:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={datadir / 'data'}",
                f"--web.listen-address={hostport}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            cwd=datadir,
        )
    server = PrometheusServer(proc, f"http://{hostport}", datadir)
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            if proc.poll() is not None:
                tail = (datadir / "prometheus.log").read_text(errors="replace")[-2000:]
                raise PrometheusError(f"prometheus exited with {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return server
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready at {server.url} in {ready_timeout}s")
            time.sleep(0.1)
    except BaseException:
        server.stop()
        raise


@contextlib.contextmanager
def run_prometheus(
    targets: Sequence[str], datadir: str | Path, *, port: int = 0, scrape_interval: float = 1.0
) -> Iterator[PrometheusServer]:
    """``with run_prometheus(["[fd00::2]:9464"], tmp) as prom: prom.wait_for("mrc_planes")``"""
    server = start_prometheus(targets, datadir, port=port, scrape_interval=scrape_interval)
    try:
        yield server
    finally:
        server.stop()
