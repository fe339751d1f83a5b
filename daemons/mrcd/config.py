"""mrcd's configuration: one TOML file, validated at start, one-line errors naming the key.

The ``[fabric]`` table is exactly the testbed's (``mrcstack.fabric.Fabric``), so a daemon runs
unchanged on real hosts behind real SRv6 switches.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric, FabricConfigError

DATA_PORT = 4791
CONTROL_PORT = 4792
#: The fabric mapper's agent listener, and the UDP port of the link probes' sockets.
MAPPER_PORT = 4793
LINK_PROBE_PORT = 4793
#: The probing agent's defaults: every loop every 10 ms (the paper probes every link about
#: every millisecond at scale), a probe lost when not back within 15 ms: a round and a
#: half, so the round two after a probe's always finds it due, however late its timer ran.
PROBE_INTERVAL = 0.01
PROBE_TIMEOUT = 0.015
PROBE_RATE_LIMIT = 20000.0
DEFAULT_WEB = "127.0.0.1:9464"
LOG_LEVELS = ("debug", "info", "warning", "error")
AUTH_MODES = ("psk", "keypair")
DATA_MODES = ("srv6", "loopback")
#: Seconds SIGTERM gives pending writes to complete before the rest fail (WR_FLUSH_ERR).
DRAIN_TIMEOUT = 2.0
#: How long a coalesced ACK may wait for more data on its port (seconds; the loop's timers
#: round it up to a whole millisecond when nothing else sends it first), and the most.
ACK_DELAY = 0.0005
MAX_ACK_DELAY = 0.005
#: Data-path worker processes at most (one per core is the most that helps).
MAX_WORKERS = 64
MAX_DRAIN_TIMEOUT = 3600.0

Address = tuple[str, int]


class MrcdConfigError(LocalError, ValueError):
    """A bad configuration value; ``str()`` is one line: ``mrcd.key: problem``."""


def parse_address(text: str, key: str, default_port: int | None = None) -> Address:
    """``[v6]:port``, ``v4:port``, or a bare address when a default port is given."""
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([0-9.]+):(\d+)|([0-9a-fA-F:.]+)", text.strip())
    if m is None:
        raise MrcdConfigError(f"{key}: not an address ([v6]:port or v4:port): {text!r}")
    host = m.group(1) or m.group(3) or m.group(5)
    port_text = m.group(2) or m.group(4)
    if port_text is None:
        if default_port is None:
            raise MrcdConfigError(f"{key}: needs a port: {text!r}")
        port = default_port
    else:
        port = int(port_text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise MrcdConfigError(f"{key}: not an IP address: {host!r}") from None
    if not 0 <= port <= 65535:
        raise MrcdConfigError(f"{key}: port out of range: {port}")
    return host, port


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: str = "psk"
    psk_file: Path | None = None
    private_key_file: Path | None = None
    peer_keys_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class MapperAgentConfig:
    """The probing agent (``[mrcd.mapper]``, on with ``enabled = true``): this mrcd probes
    its share of the fabric mapper's plan and reports to the mapper at ``address``."""

    address: Address  # the mapper's agent listener, on the management network
    name: str = "mapper"  # the name the mapper authenticates as
    interval: float = PROBE_INTERVAL
    timeout: float = PROBE_TIMEOUT
    overlap: int = 2  # hosts per T0-T1 link: the mapper's plan must say the same
    short_repeat: int = 1  # probes per short loop per round
    probe_port: int = LINK_PROBE_PORT
    rate_limit: float = PROBE_RATE_LIMIT  # probes a second at most: rounds stretch to keep it


@dataclass(frozen=True, slots=True)
class MrcdConfig:
    host: int
    fabric: Fabric = field(default_factory=Fabric)
    control_address: Address = ("::1", CONTROL_PORT)
    api_socket: Path = Path("/run/mrcstack/mrcd.sock")
    web_listen_address: str = DEFAULT_WEB
    log_level: str = "info"
    ack_coalesce: int = 16
    ack_delay: float = ACK_DELAY
    encrypt: bool = False
    # Authenticate every packet of a QP with its AES-GCM key (mrcstack's extension to OCP
    # MRC 1.0, agreed per QP: used only if both ends want it); false: the plain RoCEv2 ICRC.
    packet_auth: bool = True
    # mrcstack's extension headers (XETH/XFETH) on QPs to other mrcds: negotiated per QP,
    # used only if both ends offer the same version; false: OCP MRC 1.0's headers alone.
    extensions: bool = True
    peers: tuple[tuple[str, Address], ...] = ()  # host node name -> control address
    auth: AuthConfig = field(default_factory=AuthConfig)
    data_mode: str = "srv6"  # "loopback": plane sockets on ::1 (tests, laptops)
    data_port: int = DATA_PORT  # srv6 mode; loopback mode: base port, + host*16 + plane
    bind_devices: bool = False  # SO_BINDTODEVICE to the plane's interface (CAP_NET_RAW)
    drain_timeout: float = DRAIN_TIMEOUT  # SIGTERM: seconds pending writes get to finish
    #: The NIC port (network interface) of each plane, whose link state mrcd watches; empty
    #: means the testbed's names, nic0 .. nic<planes-1>.
    interfaces: tuple[str, ...] = ()
    #: The probing agent of the fabric mapper (None: off).
    mapper: MapperAgentConfig | None = None
    #: Data-path worker processes; 1: the data path runs in the daemon's own process.
    workers: int = 1

    def __post_init__(self) -> None:
        _check_workers(self.workers)
        if self.packet_auth and not self.extensions:
            raise MrcdConfigError(
                "mrcd.packet_auth: AES-GCM packet authentication needs mrcstack's extension "
                "headers (its nonce is their tx_seq): set packet_auth = false, or extensions = true"
            )
        if not self.interfaces:
            names = tuple(f"nic{p}" for p in range(self.fabric.planes))
            object.__setattr__(self, "interfaces", names)
        elif len(self.interfaces) != self.fabric.planes:
            raise MrcdConfigError(
                f"mrcd.interfaces: {len(self.interfaces)} names for "
                f"{self.fabric.planes} planes (one per plane)"
            )

    @property
    def host_name(self) -> str:
        return Fabric.host_name(self.host)

    def peer_address(self, host: int) -> Address:
        name = Fabric.host_name(host)
        for peer, addr in self.peers:
            if peer == name:
                return addr
        raise MrcdConfigError(f"mrcd.peers: no control address for {name}")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MrcdConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise MrcdConfigError(f"config: cannot read {path}: {exc.strerror}") from None
        return cls.from_toml(text)

    @classmethod
    def from_toml(cls, text: str) -> MrcdConfig:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise MrcdConfigError(f"toml: {exc}") from None
        unknown = set(doc) - {"mrcd", "fabric"}
        if unknown:
            raise MrcdConfigError(f"{sorted(unknown)[0]}: unknown table (only [mrcd] and [fabric])")
        try:
            fabric = Fabric.from_mapping(doc["fabric"]) if "fabric" in doc else Fabric()
        except FabricConfigError as exc:
            raise MrcdConfigError(str(exc)) from None
        table = doc.get("mrcd")
        if not isinstance(table, Mapping):
            raise MrcdConfigError("mrcd: missing [mrcd] table")
        return _from_table(table, fabric)


_KEYS = {
    "host",
    "control_address",
    "api_socket",
    "web_listen_address",
    "log_level",
    "ack_coalesce",
    "ack_delay",
    "encrypt",
    "packet_auth",
    "extensions",
    "peers",
    "auth",
    "data_mode",
    "data_port",
    "bind_devices",
    "drain_timeout",
    "interfaces",
    "mapper",
    "workers",
}


def _check_workers(n: int) -> int:
    if not 1 <= n <= MAX_WORKERS:
        raise MrcdConfigError(f"mrcd.workers: must be in 1..{MAX_WORKERS}, got {n}")
    return n


def _int(table: Mapping[str, object], key: str, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MrcdConfigError(f"mrcd.{key}: must be an integer, got {value!r}")
    return value


def _str(table: Mapping[str, object], key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise MrcdConfigError(f"mrcd.{key}: must be a string, got {value!r}")
    return value


def _bool(table: Mapping[str, object], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise MrcdConfigError(f"mrcd.{key}: must be true or false, got {value!r}")
    return value


def _seconds(table: Mapping[str, object], key: str, default: float, limit: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= limit:
        raise MrcdConfigError(
            f"mrcd.{key}: must be a number of seconds in 0..{limit:g}, got {value!r}"
        )
    return float(value)


def _table(table: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = table.get(key, {})
    if not isinstance(value, Mapping):
        raise MrcdConfigError(f"mrcd.{key}: must be a table")
    return value


def _from_table(table: Mapping[str, object], fabric: Fabric) -> MrcdConfig:
    for key in table:
        if key not in _KEYS:
            raise MrcdConfigError(f"mrcd.{key}: unknown key")
    if "host" not in table:
        raise MrcdConfigError("mrcd.host: missing (this host's index in the fabric)")
    host = _int(table, "host", 0)
    if not 0 <= host < fabric.hosts:
        raise MrcdConfigError(f"mrcd.host: must be in 0..{fabric.hosts - 1}, got {host}")
    control = parse_address(
        _str(table, "control_address", f"[::1]:{CONTROL_PORT}"),
        "mrcd.control_address",
        CONTROL_PORT,
    )
    web = _str(table, "web_listen_address", DEFAULT_WEB)
    parse_address(web, "mrcd.web_listen_address")
    level = _str(table, "log_level", "info")
    if level not in LOG_LEVELS:
        raise MrcdConfigError(
            f"mrcd.log_level: must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
        )
    coalesce = _int(table, "ack_coalesce", 16)
    if not 1 <= coalesce <= 64:
        raise MrcdConfigError(f"mrcd.ack_coalesce: must be in 1..64, got {coalesce}")
    mode = _str(table, "data_mode", "srv6")
    if mode not in DATA_MODES:
        raise MrcdConfigError(
            f"mrcd.data_mode: must be one of {', '.join(DATA_MODES)}, got {mode!r}"
        )
    port = _int(table, "data_port", DATA_PORT)
    if not 1 <= port <= 65535 - 16 * fabric.hosts:
        raise MrcdConfigError(f"mrcd.data_port: out of range: {port}")
    drain = _seconds(table, "drain_timeout", DRAIN_TIMEOUT, MAX_DRAIN_TIMEOUT)
    ack_delay = _seconds(table, "ack_delay", ACK_DELAY, MAX_ACK_DELAY)
    workers = _check_workers(_int(table, "workers", 1))
    interfaces = _interfaces(table.get("interfaces"), fabric.planes)
    peers_table = _table(table, "peers")
    peers = []
    for name, addr in sorted(peers_table.items()):
        if not re.fullmatch(r"h\d+", name) or int(name[1:]) >= fabric.hosts:
            raise MrcdConfigError(f"mrcd.peers.{name}: not a host of this fabric")
        if not isinstance(addr, str):
            raise MrcdConfigError(f"mrcd.peers.{name}: must be an address string")
        peers.append((name, parse_address(addr, f"mrcd.peers.{name}", CONTROL_PORT)))
    return MrcdConfig(
        host=host,
        fabric=fabric,
        control_address=control,
        api_socket=Path(_str(table, "api_socket", f"/run/mrcstack/mrcd-h{host}.sock")),
        web_listen_address=web,
        log_level=level,
        ack_coalesce=coalesce,
        ack_delay=ack_delay,
        encrypt=_bool(table, "encrypt", False),
        packet_auth=_bool(table, "packet_auth", True),
        extensions=_bool(table, "extensions", True),
        peers=tuple(peers),
        auth=_auth(_table(table, "auth")),
        data_mode=mode,
        data_port=port,
        bind_devices=_bool(table, "bind_devices", False),
        drain_timeout=drain,
        interfaces=interfaces,
        mapper=_mapper(_table(table, "mapper"), fabric),
        workers=workers,
    )


#: Linux interface names: 1..15 bytes (IFNAMSIZ 16), not "." or "..", no "/", ":" or space.
IFNAME_MAX = 15
_IFNAME = re.compile(r"(?!\.{1,2}$)[^/:\s]+")


def _interfaces(value: object, planes: int) -> tuple[str, ...]:
    """``interfaces = ["ens1f0", ...]`` (one per plane, in plane order) or a table
    ``[mrcd.interfaces]`` ``0 = "ens1f0"`` naming every plane; absent: the testbed's."""
    if value is None:
        return ()
    if isinstance(value, list):
        if len(value) != planes:
            raise MrcdConfigError(
                f"mrcd.interfaces: {len(value)} names for {planes} planes (one per plane)"
            )
        named = {str(p): name for p, name in enumerate(value)}
        keys = [f"mrcd.interfaces[{p}]" for p in range(planes)]
    elif isinstance(value, Mapping):
        for key in value:
            if not (key.isdigit() and int(key) < planes and key == str(int(key))):
                raise MrcdConfigError(f"mrcd.interfaces.{key}: not a plane (0..{planes - 1})")
        missing = [p for p in range(planes) if str(p) not in value]
        if missing:
            raise MrcdConfigError(f"mrcd.interfaces.{missing[0]}: missing (one name per plane)")
        named = dict(value)
        keys = [f"mrcd.interfaces.{p}" for p in range(planes)]
    else:
        raise MrcdConfigError("mrcd.interfaces: must be a list of names or a table plane = name")
    names: list[str] = []
    for plane, key in enumerate(keys):
        name = named[str(plane)]
        if (
            not isinstance(name, str)
            or _IFNAME.fullmatch(name) is None
            or len(name.encode()) > IFNAME_MAX
        ):
            raise MrcdConfigError(
                f"{key}: not an interface name (1-{IFNAME_MAX} bytes, no '/', ':' or "
                f"spaces, not '.' or '..'): {name!r}"
            )
        if name in names:
            raise MrcdConfigError(f"{key}: {name!r} is already plane {names.index(name)}'s")
        names.append(name)
    return tuple(names)


def _auth(table: Mapping[str, object], prefix: str = "mrcd.auth") -> AuthConfig:
    """An ``[mrcd.auth]`` table (or another daemon's, whose errors start with ``prefix``)."""
    known = {"mode", "psk_file", "private_key_file", "peer_keys_dir"}
    for key in table:
        if key not in known:
            raise MrcdConfigError(f"{prefix}.{key}: unknown key")
    mode = table.get("mode", "psk")
    if mode not in AUTH_MODES:
        raise MrcdConfigError(
            f"{prefix}.mode: must be one of {', '.join(AUTH_MODES)}, got {mode!r}"
        )

    def path(key: str) -> Path | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise MrcdConfigError(f"{prefix}.{key}: must be a path string")
        return Path(value)

    cfg = AuthConfig(
        mode=str(mode),
        psk_file=path("psk_file"),
        private_key_file=path("private_key_file"),
        peer_keys_dir=path("peer_keys_dir"),
    )
    if cfg.mode == "psk" and cfg.psk_file is None:
        raise MrcdConfigError(f"{prefix}.psk_file: required in psk mode")
    if cfg.mode == "keypair" and (cfg.private_key_file is None or cfg.peer_keys_dir is None):
        raise MrcdConfigError(
            f"{prefix}.private_key_file and peer_keys_dir: required in keypair mode"
        )
    return cfg


parse_auth = _auth

_MAPPER_KEYS = {
    "enabled",
    "address",
    "name",
    "interval",
    "timeout",
    "overlap",
    "short_repeat",
    "probe_port",
    "rate_limit",
}


def _mapper(table: Mapping[str, object], fabric: Fabric) -> MapperAgentConfig | None:
    """``[mrcd.mapper]``: None unless ``enabled = true``."""
    for key in table:
        if key not in _MAPPER_KEYS:
            raise MrcdConfigError(f"mrcd.mapper.{key}: unknown key")
    # Keys prefixed so that the shared getters' errors name them mrcd.mapper.<key>.
    where = {f"mapper.{k}": v for k, v in table.items()}
    if not _bool(where, "mapper.enabled", False):
        return None
    if "mapper.address" not in where:
        raise MrcdConfigError("mrcd.mapper.address: missing (the mapper's agent listener)")
    address = parse_address(_str(where, "mapper.address", ""), "mrcd.mapper.address", MAPPER_PORT)
    name = _str(where, "mapper.name", "mapper")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise MrcdConfigError(f"mrcd.mapper.name: not a host name: {name!r}")
    interval = _seconds(where, "mapper.interval", PROBE_INTERVAL, 10.0)
    timeout = _seconds(where, "mapper.timeout", PROBE_TIMEOUT, 10.0)
    if not interval > 0 or not timeout > 0:
        raise MrcdConfigError("mrcd.mapper.interval and timeout: must be more than 0")
    overlap = _int(where, "mapper.overlap", 2)
    repeat = _int(where, "mapper.short_repeat", 1)
    port = _int(where, "mapper.probe_port", LINK_PROBE_PORT)
    rate = where.get("mapper.rate_limit", PROBE_RATE_LIMIT)
    if not 1 <= overlap <= 16:
        raise MrcdConfigError(f"mrcd.mapper.overlap: must be in 1..16, got {overlap}")
    if not 1 <= repeat <= 16:
        raise MrcdConfigError(f"mrcd.mapper.short_repeat: must be in 1..16, got {repeat}")
    if not 1 <= port <= 65535 - 16 * fabric.hosts:
        raise MrcdConfigError(f"mrcd.mapper.probe_port: out of range: {port}")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 1:
        raise MrcdConfigError(f"mrcd.mapper.rate_limit: probes a second, >= 1, got {rate!r}")
    return MapperAgentConfig(address, name, interval, timeout, overlap, repeat, port, float(rate))
