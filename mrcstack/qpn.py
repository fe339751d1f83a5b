"""QP numbers as people read them: ``0x`` and six hex digits, everywhere one is printed.

A QPN is 24 bits (the BTH's destination QP).  tshark prints it as ``0xbb2357`` (six hex
digits, zero-padded) and perftest in hex too; mrcstack's tools, logs, error texts and reprs
print the same text, so one QP is followed across all of them by searching for one string.
Input accepts either form: ``0xbb2357`` or ``12264279``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

QPN_BITS = 24
QPN_MAX = (1 << QPN_BITS) - 1
#: Field names that hold a QPN, shown in hex by :func:`dataclass_repr`.
QPN_FIELDS = frozenset({"qpn", "remote_qpn", "local_qpn"})


def qpn_text(qpn: int) -> str:
    """``0xbb2357``: the one printed form of a QPN."""
    return f"0x{qpn:06x}"


def parse_qpn(text: str) -> int:
    """A QPN given as ``0xbb2357`` (hex) or ``12264279`` (decimal); ValueError naming the
    text otherwise, or when it does not fit in 24 bits."""
    word = text.strip().lower()
    try:
        value = int(word, 16) if word.startswith("0x") else int(word, 10)
    except ValueError:
        raise ValueError(f"not a QPN (0xbb2357 or 12264279): {text!r}") from None
    if not 0 <= value <= QPN_MAX:
        raise ValueError(f"QPN {text!r} out of range (24 bits: 0..{qpn_text(QPN_MAX)})")
    return value


def dataclass_repr(obj: Any) -> str:
    """A dataclass's usual repr, its QPN fields in hex (``WorkCompletion(..., qpn=0xbb2357)``)."""
    parts = []
    for f in dataclasses.fields(obj):
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        text = qpn_text(value) if f.name in QPN_FIELDS and isinstance(value, int) else repr(value)
        parts.append(f"{f.name}={text}")
    return f"{type(obj).__name__}({', '.join(parts)})"
