"""The files mrcstack ships inside its package: example fabrics and scenarios, systemd units,
the Wireshark dissector, the Grafana dashboard and Prometheus alert rules.

In a checkout they are the repository's ``examples/``, ``systemd/``, ``wireshark/`` and
``monitoring/``; in
an installed package they travel with the code, so ``--fabric examples/fabric-large.toml``
works from any directory: a path that does not exist but names a shipped file is read from
the package.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

#: The shipped folders, as they are named in the repository.
FOLDERS = ("examples", "systemd", "wireshark", "monitoring")


def shipped() -> dict[str, Traversable]:
    """Every shipped file by its repository path, e.g. ``examples/fabric-large.toml``."""
    root = resources.files("mrcstack")
    found: dict[str, Traversable] = {}
    for folder in FOLDERS:
        _walk(root / folder, folder, found)
    return found


def _walk(base: Traversable, prefix: str, found: dict[str, Traversable]) -> None:
    """Files under ``base`` by path, subfolders included (``examples/scenarios/...``)."""
    if not base.is_dir():
        return
    for item in sorted(base.iterdir(), key=lambda t: t.name):
        if item.name.startswith(".") or item.name == "__pycache__":
            continue
        if item.is_dir():
            _walk(item, f"{prefix}/{item.name}", found)
        elif item.is_file():
            found[f"{prefix}/{item.name}"] = item


def find(name: str | os.PathLike[str]) -> Traversable | None:
    """The shipped file a name stands for: ``examples/x.toml``, or just ``x.toml``."""
    text = Path(name).as_posix()
    files = shipped()
    if text in files:
        return files[text]
    matches = [item for key, item in files.items() if key.endswith("/" + text)]
    return matches[0] if len(matches) == 1 else None


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes: the path itself when it exists, else the shipped file it names
    (the OSError of the missing path when it names none)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        item = find(path)
        if item is None:
            raise
        return item.read_bytes()


def main(argv: Sequence[str]) -> int:
    """``mrcstack files [NAME]``: list the shipped files with their paths, or print one."""
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print("usage: mrcstack files [NAME]   (list shipped files, or print one)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if not argv:
        for key, item in shipped().items():
            print(f"{key:<32} {item}")
        return 0
    found = find(argv[0])
    if found is None:
        print(f"mrcstack files: {argv[0]}: no such shipped file", file=sys.stderr)
        return 1
    sys.stdout.write(found.read_text(encoding="utf-8"))
    return 0
