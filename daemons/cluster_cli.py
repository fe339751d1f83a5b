"""``mrcstack cluster up|down|status|logs``: mrcd on every host of a running testbed.

``up`` writes a cluster key and one config per host (the same ones the demo uses: PSK
authentication, control channel and metrics on the management network; ``--set KEY=VALUE``
adds any other ``[mrcd]`` setting, checked as mrcd checks its config before anything
starts) into the testbed's cluster folder, starts every daemon inside its host's namespace,
detached, and records them; with ``--mapper`` mrcmapper too (in the first host's namespace),
and every mrcd probes for it.
Each daemon's API socket is where programs in that namespace look by default, so
``mrcstack testbed exec h3 -- mrc-write-bw`` finds h3's mrcd with no flags.  ``down``
stops them gracefully (SIGTERM, the daemons' drain; SIGKILL only after the timeout), by the
exact process ids recorded; ``mrcstack testbed down`` also stops any that are left.
``logs -f`` follows the daemons' logs as they grow, each line prefixed with its host, until
Ctrl-C or the cluster goes down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mrcstack import add_version_flag
from mrcstack.daemons.cluster import METRICS_PORT, STOP_TIMEOUT, Cluster
from mrcstack.daemons.mrcd.config import CONTROL_PORT, MrcdConfig
from mrcstack.errors import LocalError
from mrcstack.netns.run import TestbedError
from mrcstack.netns.state import cluster_dir, default_name, exists, load

PROG = "mrcstack cluster"
RECORD = "cluster.json"
#: [mrcd] keys the cluster writes for each host itself (--set may not change them).
OWN_KEYS = ("host", "control_address", "api_socket", "web_listen_address", "peers", "auth")
FOLLOW_POLL = 0.2  # seconds between looks at the logs with -f


class ClusterError(LocalError):
    """The cluster cannot do what was asked (no testbed, already up, not up...)."""


def _record_path(name: str) -> Path:
    return cluster_dir(name) / RECORD


def _read(name: str) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads(_record_path(name).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{_record_path(name)}: unreadable ({exc})") from None
    return doc


def _alive(pid: int, config: str) -> bool:
    """Process ``pid`` is still the mrcd started with ``config`` (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return config.encode() in cmdline


def settings(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as [mrcd] settings: VALUE is a TOML value (``false``,
    ``8``, ``"x"``), or else a string; ClusterError naming a malformed or reserved item."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("mrcd.")
        if not sep or not key:
            raise ClusterError(f"--set {item!r}: expected KEY=VALUE, like packet_auth=false")
        if key in OWN_KEYS:
            raise ClusterError(f"--set {key}: the cluster sets it for each host itself")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise ClusterError(f"--set: cannot write {value!r} into mrcd's config")


def up(
    name: str,
    log_level: str = "info",
    sets: dict[str, Any] | None = None,
    mapper: bool = False,
) -> dict[str, Any]:
    if not exists(name):
        raise ClusterError(f"no testbed {name!r}: run `mrcstack testbed up --name {name}` first")
    state = load(name)
    if not state.complete:
        raise ClusterError(f"testbed {name} is not completely built: clean it and `up` again")
    doc = _read(name)
    if doc is not None and any(_alive(d["pid"], d["config"]) for d in doc["daemons"]):
        raise ClusterError(f"the cluster on {name} is already up (`{PROG} status`)")
    workdir = cluster_dir(name)
    sets = dict(sets or {})
    level = str(sets.pop("log_level", log_level))
    extra = "\n".join(f"{k} = {_toml(v)}" for k, v in sets.items())
    cluster = Cluster(
        state,
        workdir,
        log_level=level,
        extra=extra,
        namespace_sockets=True,
        detach=True,
        mapper=mapper,
    )
    cluster.write_configs()
    for d in cluster.daemons.values():  # what mrcd would refuse, refused before any starts
        MrcdConfig.load(d.config)
    cluster.start()
    daemons = []
    for host, d in sorted(cluster.daemons.items()):
        assert d.proc is not None  # started
        mgmt = state.mgmt[f"h{host}"]
        daemons.append(
            {
                "host": f"h{host}",
                "netns": d.netns,
                "pid": d.proc.pid,
                "config": str(d.config),
                "api_socket": str(d.api_socket),
                "control_address": f"[{mgmt}]:{CONTROL_PORT}",
                "metrics_url": f"http://[{mgmt}]:{METRICS_PORT}/metrics",
                "log": str(d.log),
            }
        )
    record: dict[str, Any] = {
        "name": name,
        "started": time.time(),
        "settings": {"log_level": level, **sets},
        "daemons": daemons,
    }
    m = cluster.mapper
    if m is not None and m.proc is not None:
        record["mapper"] = {
            "netns": m.netns,
            "pid": m.proc.pid,
            "config": str(m.config),
            "address": m.address,
            "url": m.url,
            "log": str(m.log),
        }
    _record_path(name).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _stop(procs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """SIGTERM each recorded process still running, wait, SIGKILL what is left; returns
    those killed after the timeout."""
    running = [d for d in procs if _alive(d["pid"], d["config"])]
    for d in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(d["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed = []
    for d in running:
        while _alive(d["pid"], d["config"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(d["pid"], d["config"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(d["pid"], signal.SIGKILL)
            killed.append(d)
    return killed


def down(name: str, timeout: float = STOP_TIMEOUT) -> dict[str, Any]:
    doc = _read(name)
    if doc is None:
        raise ClusterError(f"no cluster is up on {name}")
    running = [d for d in doc["daemons"] if _alive(d["pid"], d["config"])]
    killed = [d["host"] for d in _stop(running, timeout)]
    mapper = doc.get("mapper")
    mapper_state = None
    if mapper is not None:  # after the mrcds: they keep their denylist to the end
        mapper_state = "gone"
        if _alive(mapper["pid"], mapper["config"]):
            mapper_state = "killed" if _stop([mapper], timeout) else "stopped"
    for d in doc["daemons"]:
        Path(d["api_socket"]).unlink(missing_ok=True)
    _record_path(name).unlink(missing_ok=True)
    out: dict[str, Any] = {
        "name": name,
        "stopped": [d["host"] for d in running],
        "killed_after_timeout": killed,
    }
    if mapper_state is not None:
        out["mapper"] = mapper_state  # stopped, killed (after the timeout) or gone
    return out


def status(name: str) -> dict[str, Any]:
    doc = _read(name)
    if doc is None:
        return {"name": name, "up": False, "daemons": []}
    daemons = [{**d, "running": _alive(d["pid"], d["config"])} for d in doc["daemons"]]
    out: dict[str, Any] = {"name": name, "daemons": daemons}
    up = all(d["running"] for d in daemons)
    mapper = doc.get("mapper")
    if mapper is not None:
        running = _alive(mapper["pid"], mapper["config"])
        out["mapper"] = {**mapper, "running": running}
        up = up and running
    return {**out, "up": up}


def _log_files(name: str, hosts: Sequence[str]) -> dict[str, Path]:
    """Each host's log file (every host's by default), running or stopped."""
    doc = _read(name)
    if doc is None:  # stopped: the logs stay in the cluster folder until the testbed goes
        found = sorted(cluster_dir(name).glob("h*.log"), key=lambda p: int(p.stem[1:]))
        if not found:
            raise ClusterError(f"no cluster logs on {name}")
        doc = {"daemons": [{"host": p.stem, "log": str(p)} for p in found]}
    known = {d["host"]: d for d in doc["daemons"]}
    unknown = sorted(set(hosts) - set(known))
    if unknown:
        raise ClusterError(f"no host {unknown[0]} in the cluster on {name}")
    return {h: Path(known[h]["log"]) for h in hosts or sorted(known, key=lambda h: int(h[1:]))}


def logs(name: str, hosts: Sequence[str]) -> str:
    out = []
    for host, path in _log_files(name, hosts).items():
        text = path.read_text(errors="replace") if path.exists() else ""
        out.append(f"== {host} ({path}) ==\n{text}")
    return "\n".join(out)


def follow(name: str, hosts: Sequence[str], last: int = 10) -> Iterator[str]:
    """``host: line`` for the last ``last`` lines of each log, then each new line as it is
    written, until the cluster is stopped (its record goes) and every log is read out."""
    files = _log_files(name, hosts)
    offsets: dict[str, int] = {}
    for host, path in files.items():
        data = path.read_bytes() if path.exists() else b""
        offsets[host] = data.rfind(b"\n") + 1  # a line still being written comes whole later
        whole = data[: offsets[host]].decode(errors="replace").splitlines()
        for text in whole[-last:] if last else []:
            yield f"{host}: {text}"
    partial = dict.fromkeys(files, b"")
    while True:
        stopped = _read(name) is None
        for host, path in files.items():
            try:
                with path.open("rb") as f:
                    f.seek(offsets[host])
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[host] += len(data)
            *lines, partial[host] = (partial[host] + data).split(b"\n")
            for line in lines:
                yield f"{host}: {line.decode(errors='replace')}"
        if stopped:
            return
        time.sleep(FOLLOW_POLL)


def _table(doc: dict[str, Any]) -> str:
    if not doc["daemons"]:
        return f"no cluster is up on {doc['name']}"
    lines = [f"{'host':<5} {'pid':>7} {'state':<8} {'API socket':<34} {'control':<26} metrics"]
    for d in doc["daemons"]:
        state = "running" if d["running"] else "gone"
        lines.append(
            f"{d['host']:<5} {d['pid']:>7} {state:<8} {d['api_socket']:<34} "
            f"{d['control_address']:<26} {d['metrics_url']}"
        )
    m = doc.get("mapper")
    if m is not None:
        state = "running" if m["running"] else "gone"
        lines.append(
            f"{'map':<5} {m['pid']:>7} {state:<8} {'(mrcmapper, in ' + m['netns'] + ')':<34} "
            f"{m['address']:<26} {m['url']}/metrics"
        )
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="mrcd on every host of a running testbed.")
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    for command, text in (
        ("up", "start mrcd on every host (keys and configs generated)"),
        ("down", "stop them gracefully"),
        ("status", "each daemon's pid, API socket, control and metrics addresses"),
        ("logs", "each daemon's log"),
    ):
        c = sub.add_parser(command, help=text)
        c.add_argument(
            "--name", default=default_name(), help="testbed (default $MRC_TESTBED or mrc)"
        )
        if command in ("up", "down", "status"):
            c.add_argument("--json", action="store_true", help="one JSON object")
        if command == "up":
            c.add_argument(
                "--log-level", default="info", choices=("debug", "info", "warning"),
                help="mrcd's log level (info)",
            )  # fmt: skip
            c.add_argument(
                "--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                help="any [mrcd] setting for every daemon, like packet_auth=false or "
                "encrypt=true (repeat for more; VALUE is a TOML value)",
            )  # fmt: skip
            c.add_argument(
                "--mapper",
                action="store_true",
                help="also run mrcmapper, and the probing agent in every mrcd",
            )
        if command == "logs":
            c.add_argument("hosts", nargs="*", help="hosts (default all), like h3")
            c.add_argument(
                "-f", "--follow", action="store_true",
                help="print new lines as they come, each prefixed with its host, until "
                "Ctrl-C or the cluster goes down",
            )  # fmt: skip
            c.add_argument(
                "-n", "--lines", type=int, default=10, metavar="N",
                help="with -f: start from each log's last N lines (10)",
            )  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            doc = up(args.name, args.log_level, settings(args.sets), args.mapper)
            print(json.dumps(doc) if args.json else _table(status(args.name)))
        elif args.command == "down":
            doc = down(args.name)
            text = f"stopped {len(doc['stopped'])} mrcd" + (
                f", mrcmapper {doc['mapper']}" if "mapper" in doc else ""
            )
            print(json.dumps(doc) if args.json else text)
        elif args.command == "status":
            doc = status(args.name)
            print(json.dumps(doc) if args.json else _table(doc))
        elif args.follow:
            for line in follow(args.name, args.hosts, max(0, args.lines)):
                print(line, flush=True)
        else:
            sys.stdout.write(logs(args.name, args.hosts))
    except KeyboardInterrupt:
        return 0
    except (LocalError, TestbedError) as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
