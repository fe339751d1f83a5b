"""The per-packet modules compiled with mypyc, and which copy of them runs.

mrcstack is Python.  Its per-packet modules (the protocol core, the codec and mrcd's
transport: :data:`MODULES`) are also compiled into C extension modules by mypyc, the
compiler that ships with mypy, from the same typed source: ``make setup`` runs
``mrcstack native build``.  Compiled, the sending mrcd spends 12-24% less CPU per data
packet and one QP's goodput rises by a sixth to a third (docs/benchmarks.md).

The compiled copy runs only while it is the build of the sources beside it: the build
records each source's size, time and SHA-256 (``native.json``), and importing :mod:`mrcstack` checks
them.  Edit a core module and every compiled module is passed over for its Python source
(they were compiled as one group and call each other directly) until the next build; set
``MRCSTACK_PURE=1`` to run the Python source regardless.  :func:`state` says which runs.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: The modules compiled, as paths from the repository's root.  One mypyc group: they call
#: each other's functions and read each other's classes directly, so they run compiled
#: together or not at all.  Compiled, a class refuses an argument or field of the wrong
#: type with a ``TypeError`` when it is called or made (a packet with a float for an int,
#: say); what users configure is checked in modules left as Python (``core/config.py``,
#: ``core/ccparams.py``), which name the field.  Also left as Python: ``core/memory.py``
#: (mypyc cannot compile its ``memoryview`` field), ``txbatch``/``rxbatch`` (ctypes
#: structures) and everything that runs once per write or less.
MODULES = (
    "mrcstack/core/psn.py",
    "mrcstack/core/cc.py",
    "mrcstack/core/evs.py",
    "mrcstack/core/tx.py",
    "mrcstack/core/recovery.py",
    "mrcstack/core/sender.py",
    "mrcstack/core/receiver.py",
    "mrcstack/core/connection.py",
    "mrcstack/wire/layout.py",
    "mrcstack/wire/packets.py",
    "mrcstack/wire/integrity.py",
    "mrcstack/wire/codec.py",
    "mrcstack/daemons/mrcd/datapath/transport.py",
)
#: The group's shared library: ``mrcstack/native__mypyc.<abi>.so``.
GROUP = "mrcstack.native"
PURE_ENV = "MRCSTACK_PURE"
PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
MANIFEST = PACKAGE / "native.json"
#: This interpreter's extension module suffix (``.cpython-311-x86_64-linux-gnu.so``).
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def module_name(path: str) -> str:
    """``mrcstack/core/psn.py`` -> ``mrcstack.core.psn``."""
    return path.removesuffix(".py").replace("/", ".")


def _extension(path: str) -> Path:
    return ROOT / (path.removesuffix(".py") + SUFFIX)


def _library() -> Path:
    return ROOT / (GROUP.replace(".", "/") + "__mypyc" + SUFFIX)


#: A source as the build saw it: [size, mtime_ns, SHA-256].
Record = list[int | str]


def _record(path: str) -> Record:
    import hashlib  # noqa: PLC0415  (only at a build, or when a source's stat changed)

    data = (ROOT / path).read_bytes()
    st = os.stat(ROOT / path)
    return [len(data), st.st_mtime_ns, hashlib.sha256(data).hexdigest()]


def _recorded() -> dict[str, Record] | None:
    """The sources the build recorded, or None: no build, another interpreter's, unreadable."""
    try:
        data = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("suffix") != SUFFIX:
        return None
    sources = data.get("sources")
    return sources if isinstance(sources, dict) else None


def _unchanged(path: str, recorded: Record | None) -> bool:
    """Whether ``path`` is what the build compiled: by its size and time (a stat), else by
    its contents (a checkout that rewrote it unchanged)."""
    if not isinstance(recorded, list) or len(recorded) != 3:
        return False
    st = os.stat(ROOT / path)
    if [st.st_size, st.st_mtime_ns] == recorded[:2]:
        return True
    return _record(path)[2] == recorded[2]


def _check() -> str:
    """Why the Python source runs ("" when the compiled modules do)."""
    if not _library().exists():
        return "not built"
    if os.environ.get(PURE_ENV):
        return f"{PURE_ENV} is set"
    recorded = _recorded()
    if recorded is None:
        return "the build is incomplete or for another Python"
    try:
        changed = [p for p in MODULES if not _unchanged(p, recorded.get(p))]
    except OSError as exc:
        return f"a source is unreadable ({exc.strerror})"
    if changed:
        return f"{changed[0]} changed since the build ({len(changed)} in all)"
    return ""


class _SourceFirst:
    """A meta path finder that loads the compiled modules from their ``.py`` files (ahead of
    the path finder, which would pick the extension module beside each)."""

    def __init__(self) -> None:
        self.paths = {module_name(p): str(ROOT / p) for p in MODULES}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.paths.get(fullname)
        if source is None:
            return None
        import importlib.util  # noqa: PLC0415  (only when the source runs instead)

        return importlib.util.spec_from_file_location(fullname, source)


#: Why the Python source runs, decided once when mrcstack is imported (empty: compiled).
_REASON: list[str] = []


def select() -> None:
    """Called by ``mrcstack/__init__``, before any compiled module is imported: if the build
    is not the sources' (or ``MRCSTACK_PURE`` is set), import the Python source instead."""
    reason = _check()
    _REASON[:] = [reason] if reason else []
    if reason:  # (also when only some of the build's files are left)
        sys.meta_path.insert(0, _SourceFirst())


def compiled() -> bool:
    """Whether the compiled modules run in this process."""
    return not _REASON


def state() -> str:
    """One line for users: which copy of the per-packet modules runs, and why."""
    if not _REASON:
        return f"compiled (mypyc, {len(MODULES)} modules)"
    hint = "" if _REASON[0].startswith(PURE_ENV) else "; `make setup` builds it"
    return f"Python source ({_REASON[0]}{hint})"


def build(force: bool = False) -> bool:
    """Compile :data:`MODULES` in place (unless the build is already these sources'):
    whether it built.  Needs a C compiler, the Python headers and mypy."""
    recorded = _recorded()
    if (
        not force
        and _library().exists()
        and recorded is not None
        and all(_unchanged(p, recorded.get(p)) for p in MODULES)
    ):
        return False
    # Imported here: the build's tools are development dependencies, not mrcd's.
    from mypyc.build import mypycify  # noqa: PLC0415
    from setuptools import Distribution  # type: ignore[import-untyped]  # noqa: PLC0415

    # The old build's files go first (the record too: half a build never counts as the
    # sources'): the new ones are new files, where writing over the old ones would change
    # them under a running mrcd that has them mapped.
    clean()
    sources = {p: _record(p) for p in MODULES}
    cwd = Path.cwd()
    os.chdir(ROOT)  # mypyc names the modules by their paths from here
    try:
        extensions = mypycify(list(MODULES), opt_level="3", group_name=GROUP)
        dist = Distribution({"name": "mrcstack-native", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.inplace = True
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    MANIFEST.write_text(json.dumps({"suffix": SUFFIX, "sources": sources}, indent=1) + "\n")
    return True


def clean() -> list[Path]:
    """Remove the build's files (by their exact names): those removed."""
    gone = []
    for path in [*(_extension(p) for p in MODULES), _library(), MANIFEST]:
        if path.exists():
            path.unlink()
            gone.append(path)
    return gone


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mrcstack native",
        description="Build, remove or show the mypyc-compiled per-packet modules.",
    )
    parser.add_argument("command", choices=("build", "clean", "state"))
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    if args.command == "state":
        print(state())
    elif args.command == "clean":
        for path in clean():
            print(f"removed {path.relative_to(ROOT)}")
    else:
        try:
            built = build(args.force)
        except Exception as exc:  # the compiler's own output is above
            print(f"mrcstack.native: build failed: {exc}", file=sys.stderr)
            return 1
        print("mrcstack.native: " + ("built" if built else "up to date"))
    return 0
