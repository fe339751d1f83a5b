"""Trimming and ECN marking on a switch port: build, attach, configure and read the tc program.

``netns/bpf/trim.c`` is a tc BPF program for a switch port's clsact egress hook.  It models
the port's queue (a virtual queue drained at the shaped rate), trims MRC data packets to
their headers above a threshold (or with a fixed probability), ECN-marks ECT packets above a
lower threshold except on last-hop ports, and sends trimmed packets through a priority
class of the htb shaper installed here with the same rate.  ``docs/trimming.md`` explains
the model, the byte offsets and the limits.

Everything here runs a port inside a network namespace (``tc -n NETNS``).  The program's
maps are not pinned: this module finds them from the filter's program id (``tc -j filter
show``) and reads or writes them with the ``bpf(2)`` system call, so nothing but ``tc`` and
the kernel is needed at run time (no bpftool, no bpffs mount, nothing to clean up: the maps
die with the filter).  ``python -m mrcstack.netns.trim build|attach|configure|show|counters|detach``
does the same by hand.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcstack.fabric import parse_rate, parse_size
from mrcstack.netns.run import CommandError, TestbedError, one_line, run

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE = PACKAGE_DIR / "bpf" / "trim.c"


def _object_path() -> Path:
    """Where the compiled program goes: ``build/bpf/`` in a source checkout, else the user's
    cache (an installed package's directory may not be writable); ``MRC_BPF_DIR`` overrides."""
    if os.environ.get("MRC_BPF_DIR"):
        return Path(os.environ["MRC_BPF_DIR"]) / "trim.o"
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / "build" / "bpf" / "trim.o"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mrcstack" / "bpf" / "trim.o"


OBJECT = _object_path()
PROG_NAME = "mrc_trim"
FILTER_PREF = 1  # the egress filter's preference and handle: fixed, so attach is a replace
FILTER_HANDLE = 1
SHAPER_HANDLE = "7472:"  # ("tr") a distinctive major, so detach removes only our htb
ROOT_CLASS = "7472:1"
PRIO_CLASS = "7472:10"  # htb class for trimmed packets (prio 0), set as skb->priority
DATA_CLASS = "7472:20"  # htb default class for everything else (prio 1)
PRIO_CLASSID = 0x7472_0010  # PRIO_CLASS as the u32 tc uses (tc numbers are hex)
HTB_QUANTUM = 60_000  # only shares bandwidth between same-prio classes; set to silence htb
PRIO_QUEUE_PACKETS = 10_000  # trimmed packets are ~120 bytes: a deep, cheap queue
DEFAULT_QUEUE_BYTES = 1 << 20  # data queue when attach() gets no queue_bytes (>= 2x trim)
MAX_RATE_BPS = 100_000_000_000  # keeps elapsed_ns * bytes_per_s inside 64 bits in trim.c
PROBABILITY_ONE = 1 << 32  # probability 1.0 in the program's 1/2^32 units
NO_THRESHOLD = (1 << 64) - 1  # "never": ECN disabled

MODE_OFF, MODE_CONGESTION, MODE_PROBABILITY = 0, 1, 2  # enum trim_mode in trim.c
CFG_LAST_HOP, CFG_ECN_ANY = 0x1, 0x2

# Map layouts, mirrored from trim.c (native byte order, no padding: every field aligned).
_CFG = struct.Struct("=QQQQQQIIII")  # rate, rate_bits, trim, ecn, queue, prob, mode, flags,
#                                      prio_class, pad
_QUEUE = struct.Struct("=IIQQQ")  # lock, pad, backlog, last_ns, rem
STAT_NAMES = (
    "packets",
    "bytes",
    "trimmed",
    "ecn_marked",
    "passed",
    "mrc_data",
    "priority",
    "overlimit",
    "trim_errors",
    "requeued",
    "class_data",  # packets per traffic class (DSCP 4, 46, 12, anything else)
    "class_control",
    "class_trimmed",
    "class_other",
)
_STATS = struct.Struct("=" + "Q" * len(STAT_NAMES))
_MAPS = {"trim_cfg": _CFG.size, "trim_queue": _QUEUE.size, "trim_stats": _STATS.size}


class TrimError(TestbedError):
    """Trimming cannot be set up or read: the one-line message says what and why.

    A :class:`TestbedError`, so the fault harness treats a failing attach or detach like
    any other failing operation on the testbed (and ``restore_all`` goes on past it)."""


@dataclass(frozen=True, slots=True)
class TrimConfig:
    """One port's trimming configuration (what the program's config map holds).

    ``rate_bps`` 0 means unshaped: no htb and an always-empty virtual queue, so congestion
    mode trims only frames longer than the threshold and nothing is ECN-marked.
    ``ecn_threshold_bytes`` None disables ECN marking.  ``probability`` set selects the
    fixed-probability trim mode (stored in 1/2^32 units, so it reads back rounded).
    ``queue_bytes`` is the data queue's size (bfifo, and the model's tail drop); None picks
    ``max(DEFAULT_QUEUE_BYTES, 2 * trim_threshold_bytes)`` when shaped, and reads back as
    that number.  Thresholds count Ethernet frame bytes, as htb does.  ``enabled`` False
    leaves the program attached but inert (it only counts).  ``ecn_any`` marks any ECT IPv6
    packet (kernel TCP baselines), not only MRC's.
    """

    rate_bps: int
    trim_threshold_bytes: int
    ecn_threshold_bytes: int | None = None
    last_hop: bool = False
    probability: float | None = None
    queue_bytes: int | None = None
    enabled: bool = True
    ecn_any: bool = False

    def __post_init__(self) -> None:
        _check_int("rate_bps", self.rate_bps, 0, MAX_RATE_BPS)
        _check_int("trim_threshold_bytes", self.trim_threshold_bytes, 0, NO_THRESHOLD)
        if self.ecn_threshold_bytes is not None:
            _check_int("ecn_threshold_bytes", self.ecn_threshold_bytes, 0, NO_THRESHOLD - 1)
        if self.queue_bytes is not None:
            _check_int("queue_bytes", self.queue_bytes, 1, NO_THRESHOLD)
        if self.probability is not None and (
            isinstance(self.probability, bool)
            or not isinstance(self.probability, int | float)
            or not 0.0 <= self.probability <= 1.0
        ):
            raise TrimError(f"probability: must be in [0, 1], got {self.probability!r}")

    @property
    def mode(self) -> str:
        if not self.enabled:
            return "off"
        return "congestion" if self.probability is None else "probability"

    @property
    def effective_queue_bytes(self) -> int:
        """Bytes the data queue holds (0 when unshaped: there is no queue)."""
        if not self.rate_bps:
            return 0
        if self.queue_bytes is not None:
            return self.queue_bytes
        return max(DEFAULT_QUEUE_BYTES, 2 * self.trim_threshold_bytes)

    def pack(self) -> bytes:
        mode = {"off": MODE_OFF, "congestion": MODE_CONGESTION, "probability": MODE_PROBABILITY}
        flags = (CFG_LAST_HOP if self.last_hop else 0) | (CFG_ECN_ANY if self.ecn_any else 0)
        prob = round((self.probability or 0.0) * PROBABILITY_ONE)
        ecn = NO_THRESHOLD if self.ecn_threshold_bytes is None else self.ecn_threshold_bytes
        return _CFG.pack(
            self.rate_bps // 8,
            self.rate_bps,
            self.trim_threshold_bytes,
            ecn,
            self.effective_queue_bytes,
            prob,
            mode[self.mode],
            flags,
            PRIO_CLASSID if self.rate_bps else 0,
            0,
        )

    @classmethod
    def unpack(cls, data: bytes) -> TrimConfig:
        _, rate_bits, trim, ecn, queue, prob, mode, flags, _, _ = _CFG.unpack(data)
        return cls(
            rate_bps=rate_bits,
            trim_threshold_bytes=trim,
            ecn_threshold_bytes=None if ecn == NO_THRESHOLD else ecn,
            last_hop=bool(flags & CFG_LAST_HOP),
            probability=prob / PROBABILITY_ONE if mode == MODE_PROBABILITY else None,
            queue_bytes=queue or None,
            enabled=mode != MODE_OFF,
            ecn_any=bool(flags & CFG_ECN_ANY),
        )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TrimError(f"{name}: must be an integer in [{low}, {high}], got {value!r}")


# --- build -------------------------------------------------------------------------------


def _include_dirs() -> list[str]:
    """The multiarch include directory (asm/types.h), which ``-target bpf`` does not search."""
    machine = platform.machine()
    names = [f"{machine}-linux-gnu", "aarch64-linux-gnu" if machine == "arm64" else ""]
    return [f"-I/usr/include/{n}" for n in names if n and Path("/usr/include", n).is_dir()]


def build_problem() -> str | None:
    """Why trim.c cannot be compiled on this machine (None when it can)."""
    if shutil.which("clang") is None:
        return "clang not found: apt-get install -y clang libbpf-dev"
    if not Path("/usr/include/bpf/bpf_helpers.h").is_file():
        return "libbpf headers not found: apt-get install -y libbpf-dev"
    return None


def is_built(obj: Path = OBJECT) -> bool:
    """The compiled object exists and is not older than trim.c."""
    return obj.is_file() and obj.stat().st_mtime >= SOURCE.stat().st_mtime


def unavailable_reason() -> str | None:
    """Why trimming cannot work on this machine (None when it can): for skips and errors."""
    if (problem := build_problem()) is not None:
        return problem
    if shutil.which("tc") is None:
        return "tc not found: apt-get install -y iproute2"
    if platform.machine() not in _NR_BPF:
        return f"no bpf(2) syscall number known for {platform.machine()}"
    if os.geteuid() != 0:
        return "attaching tc BPF programs needs root"
    return None


def build(force: bool = False) -> Path:
    """Compile trim.c to :data:`OBJECT` (only when missing or older than the source)."""
    if not force and is_built():
        return OBJECT
    clang = shutil.which("clang")
    if clang is None:
        raise TrimError("clang not found: apt-get install -y clang libbpf-dev")
    OBJECT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OBJECT.with_name(f".{OBJECT.name}.{os.getpid()}")
    argv = [clang, "-O2", "-g", "-Wall", "-target", "bpf", *_include_dirs()]
    argv += ["-c", str(SOURCE), "-o", str(tmp)]
    proc = run(argv, check=False, timeout=120)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise TrimError(f"clang failed on {SOURCE.name}: {one_line(proc.stderr)}")
    os.replace(tmp, OBJECT)  # atomic: a concurrent build never leaves a half-written object
    return OBJECT


# --- tc ----------------------------------------------------------------------------------


def _tc(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return run(["tc", "-n", netns, *args])
    except CommandError as exc:
        raise TrimError(str(exc)) from None


def _tc_json(netns: str, *args: str) -> list[dict[str, Any]]:
    out = _tc(netns, "-j", *args).stdout.strip()
    data = json.loads(out) if out else []
    return data if isinstance(data, list) else []


def _is_ours(qdisc: dict[str, Any]) -> bool:
    return qdisc.get("kind") == "htb" and qdisc.get("handle") == SHAPER_HANDLE


def _root_is_ours(netns: str, ifname: str) -> bool:
    return any(_is_ours(q) for q in _tc_json(netns, "qdisc", "show", "dev", ifname, "root"))


def _apply_shaper(netns: str, ifname: str, cfg: TrimConfig) -> None:
    """htb root with the port rate; class :10 (prio 0) for trimmed packets, :20 the rest."""
    ours = _root_is_ours(netns, ifname)
    if not cfg.rate_bps:
        if ours:
            _tc(netns, "qdisc", "del", "dev", ifname, "root")
        return
    dev, rate = f"dev {ifname}", f"{cfg.rate_bps}bit"
    htb = f"htb rate {rate} ceil {rate} quantum {HTB_QUANTUM}"
    root = f"qdisc replace {dev} root handle {SHAPER_HANDLE} htb default 20"
    lines = [] if ours else [root]  # htb cannot "change" itself: replace others' roots only
    lines += [
        f"class replace {dev} parent {SHAPER_HANDLE} classid {ROOT_CLASS} {htb}",
        f"class replace {dev} parent {ROOT_CLASS} classid {PRIO_CLASS} {htb} prio 0",
        # Data is guaranteed almost nothing and borrows the rest: trimmed packets go first.
        f"class replace {dev} parent {ROOT_CLASS} classid {DATA_CLASS} htb rate 8kbit "
        f"ceil {rate} quantum {HTB_QUANTUM} prio 1",
        f"qdisc replace {dev} parent {PRIO_CLASS} handle 7473: pfifo limit {PRIO_QUEUE_PACKETS}",
        f"qdisc replace {dev} parent {DATA_CLASS} handle 7474: bfifo "
        f"limit {cfg.effective_queue_bytes}",
    ]
    for line in lines:
        _tc(netns, *line.split())


def _prog_id(netns: str, ifname: str) -> int | None:
    for entry in _tc_json(netns, "filter", "show", "dev", ifname, "egress"):
        prog = entry.get("options", {}).get("prog", {})
        if entry.get("pref") == FILTER_PREF and prog.get("name") == PROG_NAME:
            return int(prog["id"])
    return None


# --- the bpf(2) system call --------------------------------------------------------------

_NR_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "loongarch64": 280}
_BPF_MAP_LOOKUP_ELEM, _BPF_MAP_UPDATE_ELEM = 1, 2
_BPF_PROG_GET_FD_BY_ID, _BPF_MAP_GET_FD_BY_ID, _BPF_OBJ_GET_INFO_BY_FD = 13, 14, 15
_ATTR_SIZE = 128
_PROG_INFO_NR_MAP_IDS, _PROG_INFO_MAP_IDS = 52, 56  # offsets in struct bpf_prog_info
_MAP_INFO_VALUE_SIZE, _MAP_INFO_NAME = 12, 24  # offsets in struct bpf_map_info
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_uint]


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise TrimError(f"no bpf(2) syscall number known for {platform.machine()}")
    ret = int(_syscall(nr, cmd, ctypes.addressof(attr), ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise TrimError(f"bpf(2) command {cmd} failed: {os.strerror(err)}")
    return ret


def _attr(fmt: str, *values: int) -> ctypes.Array[ctypes.c_char]:
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, attr, 0, *values)
    return attr


def _info(fd: int, size: int) -> ctypes.Array[ctypes.c_char]:
    info = ctypes.create_string_buffer(size)
    _bpf(_BPF_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, size, ctypes.addressof(info)))
    return info


def _possible_cpus() -> int:
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


class _PortMaps:
    """File descriptors of one attached program's three maps (close with ``close()``)."""

    def __init__(self, prog_id: int) -> None:
        self.fds: dict[str, int] = {}
        prog_fd = _bpf(_BPF_PROG_GET_FD_BY_ID, _attr("=I", prog_id))
        try:
            ids = ctypes.create_string_buffer(4 * 16)
            info = ctypes.create_string_buffer(256)
            struct.pack_into("=I", info, _PROG_INFO_NR_MAP_IDS, 16)
            struct.pack_into("=Q", info, _PROG_INFO_MAP_IDS, ctypes.addressof(ids))
            _bpf(_BPF_OBJ_GET_INFO_BY_FD, _attr("=IIQ", prog_fd, 256, ctypes.addressof(info)))
            (count,) = struct.unpack_from("=I", info, _PROG_INFO_NR_MAP_IDS)
            for map_id in struct.unpack_from(f"={min(count, 16)}I", ids):
                self._open_map(map_id)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(prog_fd)
        missing = sorted(set(_MAPS) - set(self.fds))
        if missing:
            self.close()
            raise TrimError(f"program {prog_id} has no map {missing[0]}: not mrcstack's trim.o")

    def _open_map(self, map_id: int) -> None:
        fd = _bpf(_BPF_MAP_GET_FD_BY_ID, _attr("=I", map_id))
        info = _info(fd, 128)
        name = info.raw[_MAP_INFO_NAME : _MAP_INFO_NAME + 16].split(b"\0")[0].decode()
        (value_size,) = struct.unpack_from("=I", info, _MAP_INFO_VALUE_SIZE)
        if name not in _MAPS or name in self.fds:
            os.close(fd)
            return
        self.fds[name] = fd
        if value_size != _MAPS[name]:
            raise TrimError(
                f"map {name} holds {value_size} bytes, expected {_MAPS[name]}: "
                "trim.c and netns/trim.py disagree (rebuild: python -m mrcstack.netns.trim "
                "build --force)"
            )

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def lookup(self, name: str, size: int) -> bytes:
        key = ctypes.create_string_buffer(struct.pack("=I", 0), 4)
        value = ctypes.create_string_buffer(size)
        addrs = (ctypes.addressof(key), ctypes.addressof(value))
        _bpf(_BPF_MAP_LOOKUP_ELEM, _attr("=IIQQQ", self.fds[name], 0, *addrs, 0))
        return value.raw

    def update(self, name: str, data: bytes) -> None:
        key = ctypes.create_string_buffer(struct.pack("=I", 0), 4)
        value = ctypes.create_string_buffer(data, len(data))
        addrs = (ctypes.addressof(key), ctypes.addressof(value))
        _bpf(_BPF_MAP_UPDATE_ELEM, _attr("=IIQQQ", self.fds[name], 0, *addrs, 0))


@contextmanager
def _maps(netns: str, ifname: str) -> Iterator[_PortMaps]:
    prog_id = _prog_id(netns, ifname)
    if prog_id is None:
        raise TrimError(f"no trim program attached to {ifname} in {netns}")
    maps = _PortMaps(prog_id)
    try:
        yield maps
    finally:
        maps.close()


# --- public API --------------------------------------------------------------------------


def attach(
    netns: str,
    ifname: str,
    *,
    rate_bps: int,
    trim_threshold_bytes: int,
    ecn_threshold_bytes: int | None,
    last_hop: bool,
    probability: float | None = None,
    queue_bytes: int | None = None,
    ecn_any: bool = False,
) -> TrimConfig:
    """Shape ``ifname`` in ``netns`` and attach the trim program; idempotent (re-attach
    replaces the program and resets its queue and counters).  Returns the configuration.

    The port's root qdisc becomes mrcstack's htb (any other root qdisc is replaced); on a
    failure halfway, whatever was set up is removed again.
    """
    cfg = TrimConfig(
        rate_bps=rate_bps,
        trim_threshold_bytes=trim_threshold_bytes,
        ecn_threshold_bytes=ecn_threshold_bytes,
        last_hop=last_hop,
        probability=probability,
        queue_bytes=queue_bytes,
        ecn_any=ecn_any,
    )
    obj = build()
    try:
        _apply_shaper(netns, ifname, cfg)
        _tc(netns, "qdisc", "replace", "dev", ifname, "clsact")
        filt = f"filter replace dev {ifname} egress pref {FILTER_PREF} handle {FILTER_HANDLE}"
        _tc(netns, *filt.split(), "bpf", "da", "obj", str(obj), "sec", "tc")
        with _maps(netns, ifname) as maps:  # until this write the program is inert (mode off)
            maps.update("trim_cfg", cfg.pack())
    except BaseException:
        with suppress(TrimError):  # report the original failure, not the clean-up's
            detach(netns, ifname)
        raise
    return cfg


def detach(netns: str, ifname: str) -> None:
    """Remove the trim program and mrcstack's htb shaper from the port; idempotent.

    The clsact qdisc goes too unless someone else's filters still use it.
    """
    dev = ("dev", ifname)
    qdiscs = _tc_json(netns, "qdisc", "show", *dev)  # fails on a missing netns or device
    if any(q.get("kind") == "clsact" for q in qdiscs):
        if _prog_id(netns, ifname) is not None:
            ours = f"egress pref {FILTER_PREF} handle {FILTER_HANDLE} bpf"
            _tc(netns, "filter", "del", *dev, *ours.split())
        others = [
            f
            for hook in ("ingress", "egress")
            for f in _tc_json(netns, "filter", "show", *dev, hook)
        ]
        if not others:
            _tc(netns, "qdisc", "del", *dev, "clsact")
    if any(q.get("root") and _is_ours(q) for q in qdiscs):
        _tc(netns, "qdisc", "del", *dev, "root")


def attached(netns: str, ifname: str) -> bool:
    return _prog_id(netns, ifname) is not None


def config(netns: str, ifname: str) -> TrimConfig:
    """The configuration the attached program runs with."""
    with _maps(netns, ifname) as maps:
        return TrimConfig.unpack(maps.lookup("trim_cfg", _CFG.size))


def configure(netns: str, ifname: str, **changes: Any) -> TrimConfig:
    """Change an attached port's configuration live (fields of :class:`TrimConfig`).

    The queue state and counters are kept; a rate or queue change also re-shapes the port.
    """
    with _maps(netns, ifname) as maps:
        current = TrimConfig.unpack(maps.lookup("trim_cfg", _CFG.size))
        try:
            new = dataclasses.replace(current, **changes)
        except TypeError as exc:
            raise TrimError(f"configure: {exc}") from None
        if (new.rate_bps, new.effective_queue_bytes) != (
            current.rate_bps,
            current.effective_queue_bytes,
        ):
            _apply_shaper(netns, ifname, new)
        maps.update("trim_cfg", new.pack())
    return new


def counters(netns: str, ifname: str) -> dict[str, int]:
    """The program's counters summed over CPUs (``STAT_NAMES``), plus ``backlog_bytes``:
    the virtual queue's backlog now (drained up to the present at the configured rate)."""
    ncpu = _possible_cpus()
    stride = (_STATS.size + 7) // 8 * 8
    with _maps(netns, ifname) as maps:
        raw = maps.lookup("trim_stats", stride * ncpu)
        cfg_raw = maps.lookup("trim_cfg", _CFG.size)
        queue_raw = maps.lookup("trim_queue", _QUEUE.size)
    totals = [0] * len(STAT_NAMES)
    for cpu in range(ncpu):
        for i, value in enumerate(_STATS.unpack_from(raw, cpu * stride)):
            totals[i] += value
    result = dict(zip(STAT_NAMES, totals, strict=True))
    rate = _CFG.unpack(cfg_raw)[0]
    _, _, backlog, last_ns, _ = _QUEUE.unpack(queue_raw)
    elapsed = max(0, time.clock_gettime_ns(time.CLOCK_MONOTONIC) - last_ns)
    result["backlog_bytes"] = max(0, backlog - elapsed * rate // 1_000_000_000) if rate else 0
    return result


# --- command line ------------------------------------------------------------------------


def _config_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--rate", type=parse_rate, required=required, help="e.g. 20mbit")
    parser.add_argument("--trim-threshold", type=parse_size, required=required, help="bytes")
    parser.add_argument("--ecn-threshold", type=parse_size, help="bytes (default: no ECN)")
    parser.add_argument("--last-hop", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--probability", type=float, help="fixed-probability trim mode")
    parser.add_argument("--queue", type=parse_size, help="data queue bytes")


_CLI_FIELDS = {
    "rate": "rate_bps",
    "trim_threshold": "trim_threshold_bytes",
    "ecn_threshold": "ecn_threshold_bytes",
    "last_hop": "last_hop",
    "probability": "probability",
    "queue": "queue_bytes",
    "enabled": "enabled",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcstack.netns.trim", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="compile trim.c").add_argument("--force", action="store_true")
    for name in ("attach", "configure", "show", "counters", "detach"):
        cmd = sub.add_parser(name)
        cmd.add_argument("netns")
        cmd.add_argument("ifname")
        if name in ("attach", "configure"):
            _config_args(cmd, required=name == "attach")
        if name == "configure":
            cmd.add_argument("--enabled", action=argparse.BooleanOptionalAction, default=None)
            cmd.add_argument("--congestion", action="store_true", help="leave probability mode")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build(force=args.force))
        elif args.cmd in ("attach", "configure"):
            given = {field: getattr(args, arg, None) for arg, field in _CLI_FIELDS.items()}
            changes = {field: value for field, value in given.items() if value is not None}
            if "rate_bps" in changes:
                changes["rate_bps"] = int(changes["rate_bps"])
            if args.cmd == "attach":
                defaults = {"ecn_threshold_bytes": None, "last_hop": False}
                cfg = attach(args.netns, args.ifname, **(defaults | changes))
            else:
                if args.congestion:
                    changes["probability"] = None
                cfg = configure(args.netns, args.ifname, **changes)
            print(json.dumps(dataclasses.asdict(cfg)))
        elif args.cmd == "show":
            print(json.dumps(dataclasses.asdict(config(args.netns, args.ifname))))
        elif args.cmd == "counters":
            print(json.dumps(counters(args.netns, args.ifname)))
        else:
            detach(args.netns, args.ifname)
    except (TrimError, ValueError) as exc:
        print(f"mrcstack.netns.trim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
