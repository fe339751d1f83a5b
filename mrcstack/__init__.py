"""mrcstack: a reference open implementation of MRC (Multipath Reliable Connection).

The packages follow the README's architecture drawing, lowest first: :mod:`.wire`,
:mod:`.core` (the sans-IO QP), :mod:`.mapper` (the fabric mapper's sans-IO core),
:mod:`.sim`, :mod:`.api`, :mod:`.netns` (the testbed), :mod:`.daemons` (mrcd, mrcmapper and
the tools), :mod:`.experiments`.  Modules at this level:
:mod:`.fabric` and :mod:`.addrplan` (the fabric description and its uSID address plan),
:mod:`.render` (switch configurations), :mod:`.errors` (errors that name their side),
:mod:`.resources` (shipped data files), :mod:`.stats` (the one quantile), :mod:`.progress`
(progress lost to a fault), :mod:`.cli` and :mod:`.demo` / :mod:`.demoreport` (the
``mrcstack`` command and ``make demo``), :mod:`.native` (the per-packet modules compiled
with mypyc, and which copy of them runs).
"""

import argparse

from mrcstack import native

native.select()  # before anything imports a compiled module

__version__ = "0.1.0"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version`` on a command: prints ``PROG mrcstack VERSION`` and exits 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (mrcstack) {__version__}")
