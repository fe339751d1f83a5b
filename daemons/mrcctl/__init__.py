"""``mrcctl``: the controller API from the command line (mrc_ctl.h for operators).

    mrcctl [--socket PATH] [--json] caps
    mrcctl port [show] | port set PORT up|down | port notify HOST [--status BITMAP]
    mrcctl ev [states] [--qp QPN] [--profile ID]
    mrcctl ev format
    mrcctl ev profile create ID (--evs V:P,... | [--t1 A-B] [--plane A-B] [--entropy A-B])
                                [--ev-count N] [--min-active N] [--event-mask S,...]
    mrcctl ev profile [show] [ID] | set ID [--min-active N] [--event-mask S,...]
    mrcctl ev profile deny|allow ID EV... | destroy ID
    mrcctl ev events [--follow] [--count N]
    mrcctl cc [profile] create ID [--algorithm A] [NAME=VALUE ...] | [show] [ID] | destroy ID
    mrcctl qp [show] [QPN] | qp connect QPN --host H --qpn N --psn P [--key HEX] [--extensions]
    mrcctl probe HOST [-c N] [-i S] [--plane P --ev EV] [--timeout S]

As with iproute2, an object without an action shows it (``mrcctl port``, ``mrcctl ev``,
``mrcctl qp``) and plural names work (``ports``, ``evs``, ``qps``, ``profiles``).
Ports are planes (0-based).  EVs are numbers (``0x1203``: entropy 1, plane 2, T1 3).
QPNs print as ``0xbb2357`` (as tshark and the tools print them) and are read in either
form (``0xbb2357`` or ``12264279``).
Changes need root; queries do not.  Errors are one line on stderr; the exit status is 2
for a bad command line and 1 when mrcd refuses or cannot be reached.
"""

from __future__ import annotations

import sys

from mrcstack.api.ctl import Controller
from mrcstack.api.errors import ApiError
from mrcstack.daemons.mrcctl.cli import PROG, UsageError, normalize, parser
from mrcstack.daemons.mrcctl.commands import run

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(normalize(sys.argv[1:] if argv is None else argv))
    try:
        with Controller.open(args.socket) as ctl:
            return run(args, ctl)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except ApiError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
