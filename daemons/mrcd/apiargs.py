"""Argument checks for API requests: every value a client sends is checked here, by name.

Each helper raises :class:`ApiError` (EINVAL) whose message names the argument, so the
client's exception says exactly what was wrong (``length: must be in 1..1099511627776``).
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Mapping
from typing import Any

from mrcstack.api.errors import ApiError, invalid
from mrcstack.errors import LocalError

log = logging.getLogger("mrcd.api")

_REQUIRED: Any = object()


def get_int(
    args: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None = _REQUIRED
) -> int:
    value = args.get(key, default)
    if value is _REQUIRED:
        raise invalid(f"{key}: missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{key}: must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise invalid(f"{key}: must be in {lo}..{hi}, got {value}")
    return value


def get_opt_int(args: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    if args.get(key) is None:
        return None
    return get_int(args, key, lo, hi)


def get_float(
    args: Mapping[str, Any], key: str, lo: float, hi: float, default: float | None = _REQUIRED
) -> float:
    """A number in (lo, hi] (lo excluded: durations must be positive)."""
    value = args.get(key, default)
    if value is _REQUIRED:
        raise invalid(f"{key}: missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{key}: must be a number, got {value!r}")
    if not lo < value <= hi:
        raise invalid(f"{key}: must be in ({lo}, {hi}], got {value}")
    return float(value)


def get_bool(args: Mapping[str, Any], key: str, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise invalid(f"{key}: must be true or false, got {value!r}")
    return value


def get_str(args: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = args.get(key, default)
    if value not in choices:
        raise invalid(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def get_hex(args: Mapping[str, Any], key: str, max_len: int) -> bytes:
    value = args.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"{key}: must be a hex string")
    try:
        data = bytes.fromhex(value)
    except ValueError:
        raise invalid(f"{key}: not a hex string") from None
    if len(data) > max_len:
        raise invalid(f"{key}: at most {max_len} bytes, got {len(data)}")
    return data


def get_map(args: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = args.get(key, {})
    if not isinstance(value, Mapping):
        raise invalid(f"{key}: must be an object")
    return value


def get_list(args: Mapping[str, Any], key: str, max_len: int) -> list[Any]:
    value = args.get(key, [])
    if not isinstance(value, list):
        raise invalid(f"{key}: must be a list")
    if len(value) > max_len:
        raise invalid(f"{key}: at most {max_len} entries, got {len(value)}")
    return value


def to_api_error(exc: BaseException, op: str) -> ApiError:
    """What a failed handler tells the client (unexpected failures are logged too)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, LocalError | ValueError):
        return ApiError(errno.EINVAL, str(exc))
    if isinstance(exc, TimeoutError):
        return ApiError(errno.ETIMEDOUT, f"{op}: timed out")
    if isinstance(exc, ConnectionRefusedError):
        return ApiError(errno.ECONNREFUSED, f"{op}: {exc}")
    log.error("event=api_internal_error op=%s error=%r", op, exc, exc_info=exc)
    return ApiError(errno.EIO, f"{op}: internal error in mrcd: {exc!r}")
