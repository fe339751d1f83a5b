"""mrcstack: a reference open implementation of MRC (Multipath Reliable Connection)."""

import argparse

__version__ = "0.1.0"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version`` on a command: prints ``PROG mrcstack VERSION`` and exits 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (mrcstack) {__version__}")
