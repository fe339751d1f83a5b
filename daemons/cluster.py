"""Run one mrcd per host of a testbed: configs, keys, processes, clean shutdown.

Used by the demo, the system tests and the benchmarks.  Each daemon runs inside its host's
namespace (``ip netns exec``), sends data on the fabric, and puts its control channel and
metrics on the management network; its API socket is a file under ``workdir``, reachable from
any namespace (memory regions travel over it as file descriptors).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from mrcstack.api.verbs import namespace_socket
from mrcstack.daemons.mrcd.config import CONTROL_PORT, MAPPER_PORT
from mrcstack.errors import LocalError
from mrcstack.netns.state import TestbedState

METRICS_PORT = 9464
MAPPER_WEB_PORT = 9465
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


@dataclass
class Daemon:
    host: int
    netns: str
    config: Path
    api_socket: Path
    metrics_url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)


@dataclass
class Mapper:
    """mrcmapper, in the first host's namespace on its management address: the testbed's
    namespaces hold everything it runs, so ``mrcstack testbed down`` stops it too."""

    netns: str
    config: Path
    address: str  # the agents' listener, [addr]:port
    url: str  # its web address: /metrics, /status, /fabric.png
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class Cluster:
    """mrcd on every (or some) host of a running testbed.  Use as a context manager."""

    def __init__(
        self,
        state: TestbedState,
        workdir: Path,
        *,
        hosts: list[int] | None = None,
        log_level: str = "info",
        extra: str = "",
        namespace_sockets: bool = False,
        detach: bool = False,
        mapper: bool = False,
        mapper_extra: str = "",
        agent_extra: str = "",
    ) -> None:
        """``namespace_sockets``: each API socket where programs in that host's namespace
        look by default (:func:`mrcstack.api.verbs.namespace_socket`), not in ``workdir``;
        ``detach``: the daemons outlive this process (their own session, no terminal);
        ``mapper``: mrcmapper runs too (started first, stopped last) and every mrcd probes
        for it, with ``mapper_extra`` more [mrcmapper] keys and ``agent_extra`` more
        [mrcd.mapper] keys."""
        self.mapper: Mapper | None = None
        self.mapper_extra = mapper_extra
        self.agent_extra = agent_extra
        self.with_mapper = mapper
        self.namespace_sockets = namespace_sockets
        self.detach = detach
        self.state = state
        self.workdir = workdir
        self.hosts = hosts if hosts is not None else list(range(state.fabric.hosts))
        self.log_level = log_level
        self.extra = extra  # more [mrcd] keys, e.g. 'encrypt = true'
        self.psk = workdir / "cluster.key"
        self.daemons: dict[int, Daemon] = {}

    def _mgmt(self, host: int) -> str:
        return self.state.mgmt[f"h{host}"]

    def write_configs(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.psk, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        peers = "\n".join(f'h{h} = "[{self._mgmt(h)}]:{CONTROL_PORT}"' for h in self.hosts)
        fabric = self.state.fabric.to_toml()
        agent = self._write_mapper(fabric) if self.with_mapper else ""
        for host in self.hosts:
            mgmt = self._mgmt(host)
            cfg = self.workdir / f"h{host}.toml"
            netns = self.state.ns(f"h{host}")
            sock = (
                namespace_socket(netns)
                if self.namespace_sockets
                else self.workdir / f"h{host}.sock"
            )
            cfg.write_text(
                f"""[mrcd]
host = {host}
control_address = "[{mgmt}]:{CONTROL_PORT}"
api_socket = "{sock}"
web_listen_address = "[{mgmt}]:{METRICS_PORT}"
log_level = "{self.log_level}"
{self.extra}
{agent}
[mrcd.peers]
{peers}

[mrcd.auth]
mode = "psk"
psk_file = "{self.psk}"

{fabric}"""
            )
            self.daemons[host] = Daemon(
                host=host,
                netns=self.state.ns(f"h{host}"),
                config=cfg,
                api_socket=sock,
                metrics_url=f"http://[{mgmt}]:{METRICS_PORT}/metrics",
                log=self.workdir / f"h{host}.log",
            )

    def _write_mapper(self, fabric: str) -> str:
        """The mapper's config (on the first host's management address); the [mrcd.mapper]
        table every mrcd gets."""
        first = self.hosts[0]
        bridge = self._mgmt(first)
        address = f"[{bridge}]:{MAPPER_PORT}"
        config = self.workdir / "mapper.toml"
        config.write_text(
            f"""[mrcmapper]
listen_address = "{address}"
web_listen_address = "[{bridge}]:{MAPPER_WEB_PORT}"
log_level = "{self.log_level}"
{self.mapper_extra}
[mrcmapper.auth]
mode = "psk"
psk_file = "{self.psk}"

{fabric}"""
        )
        self.mapper = Mapper(
            self.state.ns(f"h{first}"),
            config,
            address,
            f"http://[{bridge}]:{MAPPER_WEB_PORT}",
            self.workdir / "mapper.log",
        )
        return f"""[mrcd.mapper]
enabled = true
address = "{address}"
{self.agent_extra}
"""

    def start(self, timeout: float = START_TIMEOUT) -> None:
        self.write_configs()
        try:
            if self.mapper is not None:
                self._spawn_mapper("wb")
                self._wait_mapper(time.monotonic() + timeout)
            for d in self.daemons.values():
                self._spawn(d, "wb")
            deadline = time.monotonic() + timeout
            for d in self.daemons.values():
                self._wait_ready(d, deadline)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, d: Daemon, mode: str) -> None:
        with d.log.open(mode) as log:
            d.proc = subprocess.Popen(
                ["ip", "netns", "exec", d.netns, sys.executable,
                 "-m", "mrcstack.daemons.mrcd.ops.main", "--config", str(d.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=self.detach,
            )  # fmt: skip

    def _spawn_mapper(self, mode: str) -> None:
        m = self.mapper
        if m is None:
            raise LocalError("this cluster runs no mapper")
        with m.log.open(mode) as log:
            m.proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    m.netns,
                    sys.executable,
                    "-m",
                    "mrcstack.daemons.mrcmapper.main",
                    "--config",
                    str(m.config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=self.detach,
            )

    def _wait_mapper(self, deadline: float) -> None:
        m = self.mapper
        assert m is not None  # only called when there is one
        while time.monotonic() < deadline:
            if m.proc is not None and m.proc.poll() is not None:
                tail = " | ".join(m.log.read_text(errors="replace").strip().splitlines()[-5:])
                raise LocalError(f"mrcmapper exited: {tail}")
            try:
                with urllib.request.urlopen(f"{m.url}/status", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise LocalError(f"mrcmapper not ready after {START_TIMEOUT}s")

    def kill_mapper(self) -> None:
        """SIGKILL mrcmapper, as a crash would."""
        m = self.mapper
        if m is not None and m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()

    def restart_mapper(self, timeout: float = START_TIMEOUT) -> None:
        """Start mrcmapper again on the same config (its log is appended to)."""
        m = self.mapper
        if m is None:
            raise LocalError("this cluster runs no mapper")
        if m.proc is not None and m.proc.poll() is None:
            raise LocalError("mrcmapper is still running")
        self._spawn_mapper("ab")
        self._wait_mapper(time.monotonic() + timeout)

    def kill(self, host: int) -> None:
        """SIGKILL one daemon, as a host crash or the OOM killer would: nothing of it runs
        its cleanup (its API socket file stays behind)."""
        d = self.daemons[host]
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()

    def restart(self, host: int, timeout: float = START_TIMEOUT) -> None:
        """Start one daemon again on the same config (after :meth:`kill` or a crash); its
        log is appended to."""
        d = self.daemons[host]
        if d.proc is not None and d.proc.poll() is None:
            raise LocalError(f"mrcd on h{host} is still running")
        d.api_socket.unlink(missing_ok=True)  # a killed daemon's; readiness looks for it
        self._spawn(d, "ab")
        self._wait_ready(d, time.monotonic() + timeout)

    def _wait_ready(self, d: Daemon, deadline: float) -> None:
        while time.monotonic() < deadline:
            if d.proc is not None and d.proc.poll() is not None:
                raise LocalError(f"mrcd on h{d.host} exited: {self.tail(d.host)}")
            if d.api_socket.exists():
                try:
                    with urllib.request.urlopen(d.metrics_url, timeout=1):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise LocalError(f"mrcd on h{d.host} not ready after {START_TIMEOUT}s: {self.tail(d.host)}")

    def tail(self, host: int, lines: int = 5) -> str:
        log = self.daemons[host].log
        text = log.read_text(errors="replace") if log.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT) -> dict[int, int | None]:
        """SIGTERM every daemon, wait, SIGKILL stragglers, then the mapper the same way;
        returns exit codes by host (the mapper's as host -1)."""
        codes: dict[int, int | None] = {}
        for d in self.daemons.values():
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for d in self.daemons.values():
            if d.proc is None:
                continue
            try:
                d.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
            codes[d.host] = d.proc.returncode
        m = self.mapper
        if m is not None and m.proc is not None:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)
            try:
                m.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()
            codes[-1] = m.proc.returncode
        return codes

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
