"""mrcmapper's configuration: one TOML file, ``[mrcmapper]`` and ``[fabric]``, checked at
start; a bad key or value stops it with one line naming the key."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mrcstack.daemons.mrcd.config import (
    MAPPER_PORT,
    PROBE_INTERVAL,
    Address,
    AuthConfig,
    MrcdConfigError,
    parse_address,
    parse_auth,
)
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric, FabricConfigError
from mrcstack.mapper.localize import Params

DEFAULT_WEB = "127.0.0.1:9465"
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The localizer's windows and bucket in rounds of the agents' interval (1, 2.5 and 5 s and
#: 0.25 s at 10 ms), and how long a loop stays evidence without a report.
WINDOW_ROUNDS = (100, 250, 500)
BUCKET_ROUNDS = 25
STALE_ROUNDS = 100


class MapperConfigError(LocalError, ValueError):
    """A bad configuration value; ``str()`` is one line: ``mrcmapper.key: problem``."""


@dataclass(frozen=True, slots=True)
class MapperConfig:
    fabric: Fabric
    auth: AuthConfig
    listen_address: Address = ("::1", MAPPER_PORT)
    web_listen_address: str = DEFAULT_WEB
    name: str = "mapper"
    log_level: str = "info"
    interval: float = PROBE_INTERVAL  # the agents' probe interval
    overlap: int = 2
    params: Params = field(default_factory=Params)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MapperConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise MapperConfigError(f"config: cannot read {path}: {exc.strerror}") from None
        return cls.from_toml(text)

    @classmethod
    def from_toml(cls, text: str) -> MapperConfig:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise MapperConfigError(f"toml: {exc}") from None
        unknown = set(doc) - {"mrcmapper", "fabric"}
        if unknown:
            raise MapperConfigError(
                f"{sorted(unknown)[0]}: unknown table (only [mrcmapper] and [fabric])"
            )
        try:
            fabric = Fabric.from_mapping(doc["fabric"]) if "fabric" in doc else Fabric()
        except FabricConfigError as exc:
            raise MapperConfigError(str(exc)) from None
        table = doc.get("mrcmapper")
        if not isinstance(table, Mapping):
            raise MapperConfigError("mrcmapper: missing [mrcmapper] table")
        try:
            return _from_table(table, fabric)
        except MrcdConfigError as exc:  # a shared check's one line, already naming the key
            raise MapperConfigError(str(exc)) from None


_KEYS = {
    "listen_address",
    "web_listen_address",
    "name",
    "log_level",
    "interval",
    "overlap",
    "down_after",
    "loss_threshold",
    "confidence",
    "hold_down",
    "auth",
}


def _number(table: Mapping[str, object], key: str, default: float, lo: float, hi: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise MapperConfigError(
            f"mrcmapper.{key}: must be a number in {lo:g}..{hi:g}, got {value!r}"
        )
    return float(value)


def _string(table: Mapping[str, object], key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise MapperConfigError(f"mrcmapper.{key}: must be a string, got {value!r}")
    return value


def _from_table(table: Mapping[str, object], fabric: Fabric) -> MapperConfig:
    for key in table:
        if key not in _KEYS:
            raise MapperConfigError(f"mrcmapper.{key}: unknown key")
    listen = _string(table, "listen_address", f"[::1]:{MAPPER_PORT}")
    web = _string(table, "web_listen_address", DEFAULT_WEB)
    name = _string(table, "name", "mapper")
    level = _string(table, "log_level", "info")
    address = parse_address(listen, "mrcmapper.listen_address", MAPPER_PORT)
    parse_address(web, "mrcmapper.web_listen_address")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise MapperConfigError(f"mrcmapper.name: not a host name: {name!r}")
    if level not in LOG_LEVELS:
        raise MapperConfigError(
            f"mrcmapper.log_level: must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
        )
    overlap = table.get("overlap", 2)
    if type(overlap) is not int or not 1 <= overlap <= 16:
        raise MapperConfigError(f"mrcmapper.overlap: must be an integer in 1..16, got {overlap!r}")
    down_after = table.get("down_after", 3)
    if type(down_after) is not int or not 1 <= down_after <= 1000:
        raise MapperConfigError(
            f"mrcmapper.down_after: must be an integer in 1..1000, got {down_after!r}"
        )
    interval = _number(table, "interval", PROBE_INTERVAL, 1e-4, 10.0)
    threshold = _number(table, "loss_threshold", 0.005, 1e-4, 0.4)
    confidence = _number(table, "confidence", 0.99, 0.6, 0.999999)
    hold_down = _number(table, "hold_down", 10.0, 0.0, 86400.0)
    auth = table.get("auth", {})
    if not isinstance(auth, Mapping):
        raise MapperConfigError("mrcmapper.auth: must be a table")
    params = Params(
        down_after=down_after,
        loss_threshold=threshold,
        confidence=confidence,
        windows=tuple(w * interval for w in WINDOW_ROUNDS),
        bucket=BUCKET_ROUNDS * interval,
        hold_down=hold_down,
        stale_after=STALE_ROUNDS * interval,
    )
    return MapperConfig(
        fabric=fabric,
        auth=parse_auth(auth, "mrcmapper.auth"),
        listen_address=address,
        web_listen_address=web,
        name=name,
        log_level=level,
        interval=interval,
        overlap=overlap,
        params=params,
    )
