"""Running the few external commands the testbed needs: ``ip``, ``tc``, ``sh``.

Everything goes through :func:`run`, which turns a failure into a :class:`CommandError`
with a one-line message naming the command and what it printed on stderr, so a CLI can
print it as is.  Bulk work goes through :func:`ip_batch` (one ``ip -batch -`` process for
many lines): creating a namespace's addresses and routes costs one process, not hundreds.
"""

from __future__ import annotations

import ctypes
import os
import queue
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from mrcstack.errors import LocalError

DEFAULT_TIMEOUT = 30.0  # seconds; a single ip/tc command never takes this long
BATCH_TIMEOUT = 120.0  # an ip -batch of thousands of lines on a busy machine
_MAX_MESSAGE = 400  # characters of stderr kept in a one-line error
_SETPRIV = shutil.which("setpriv")  # util-linux; used to tie build commands to our life
NETNS_DIR = "/run/netns"  # where `ip netns add` mounts named namespaces
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class TestbedError(LocalError):
    """A testbed operation failed; the message is one line naming the problem."""

    __test__ = False  # not a pytest test class, despite the name


class CommandError(TestbedError):
    """An external command failed: names the command, its exit status and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = one_line(stderr) or "no error output"
        status = "timed out" if returncode is None else f"exit {returncode}"
        super().__init__(f"{_short(argv)}: {status}: {detail}")

    def __reduce__(self) -> tuple[type[CommandError], tuple[tuple[str, ...], int | None, str]]:
        return (type(self), (self.argv, self.returncode, self.stderr))


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    """Collapse a multi-line message into one line ("a; b"), at most ``limit`` characters."""
    joined = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def _short(argv: Sequence[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 120 else text[:117] + "..."


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,  # mirrors subprocess.run
    timeout: float = DEFAULT_TIMEOUT,
    die_with_parent: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; CommandError when it fails and ``check``.

    A missing program is a CommandError too (exit status 127, as a shell would say).
    ``die_with_parent`` makes the kernel SIGKILL the command if this process dies first
    (``setpriv --pdeathsig``), so a killed ``testbed up`` leaves no ``ip`` still creating
    objects behind the back of the ``clean`` that follows."""
    if die_with_parent and _SETPRIV is not None:
        argv = [_SETPRIV, "--pdeathsig", "KILL", *argv]
    try:
        result = subprocess.run(
            list(argv), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise CommandError(argv, 127, f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise CommandError(argv, None, stderr or f"no answer in {timeout:g} s") from None
    if check and result.returncode != 0:
        raise CommandError(argv, result.returncode, result.stderr)
    return result


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """``ip [-n NETNS] ARGS...``; returns stdout."""
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    return run(argv, check=check).stdout


def ip_batch(
    lines: Sequence[str],
    netns: str | None = None,
    *,
    force: bool = False,
    options: Sequence[str] = (),
    die_with_parent: bool = False,
) -> str:
    """Feed ``lines`` to one ``ip [OPTIONS] [-n NETNS] -batch -``; returns its stdout.

    Stops at the first failing line (CommandError naming it) unless ``force``, which runs
    every line and still reports a failure.  ``options`` are global ``ip`` options for
    every line, e.g. ``("-6",)`` so that ``route show`` lines list IPv6 routes."""
    if not lines:
        return ""
    argv = ["ip", *options, *(("-n", netns) if netns else ())]
    argv += [*(("-force",) if force else ()), "-batch", "-"]
    text = "\n".join(lines) + "\n"
    return run(argv, input=text, timeout=BATCH_TIMEOUT, die_with_parent=die_with_parent).stdout


def ns_exec(
    netns: str,
    argv: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside a namespace (``ip netns exec NETNS ...``)."""
    return run(["ip", "netns", "exec", netns, *argv], check=check, input=input, timeout=timeout)


def net_exec(
    netns: str,
    argv: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the network namespace ``netns`` only (``nsenter --net``): no mount
    namespace and no /sys remount, so about half the cost of :func:`ns_exec` (4.5 vs 8 ms
    here).  For tools that only talk netlink to the kernel, such as ``nft``."""
    path = os.path.join(NETNS_DIR, netns)
    return run(["nsenter", f"--net={path}", *argv], check=check, input=input, timeout=timeout)


def sh(netns: str | None, script: str, *, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run a short ``sh -c`` script, inside ``netns`` when given; returns stdout."""
    argv = ["sh", "-c", script]
    if netns is None:
        return run(argv, timeout=timeout).stdout
    return ns_exec(netns, argv, timeout=timeout).stdout


def call_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Call ``fn()`` on a fresh thread that first joins network namespace ``netns`` (or on
    the thread :func:`resident_netns` keeps there).

    setns(2) moves only the calling thread, and the thread ends afterwards, so the rest of
    the process stays where it was.  What ``fn`` opens there stays there: a socket created
    in ``fn`` sends and receives in ``netns`` from any thread, and /proc/sys/net opened in
    ``fn`` is that namespace's.  This replaces an ``ip netns exec`` process per call."""
    resident = _RESIDENT.get(netns)
    if resident is not None:
        with suppress(_ClosedError):  # closed meanwhile by its owner: a fresh thread as usual
            return resident.call(fn)
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            _setns(netns)
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=body, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


class _ClosedError(Exception):
    """A resident thread was closed before a call could be queued."""


class _Resident:
    """A thread that joined a namespace once and runs calls there until closed."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self._lock = threading.Lock()  # a call is queued before the closing sentinel, or not
        self._open = True
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        joined: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, args=(joined,), name=f"netns-{netns}", daemon=True
        )
        self._thread.start()
        error = joined.get()
        if error is not None:
            self._thread.join()
            raise error

    def _serve(self, joined: queue.SimpleQueue[BaseException | None]) -> None:
        try:
            _setns(self.netns)
        except BaseException as exc:  # re-raised by the constructor
            joined.put(exc)
            return
        joined.put(None)
        while (job := self._calls.get()) is not None:
            job()

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()  # a call from one of its own calls: already there
        out: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def job() -> None:
            try:
                out.put((True, fn()))
            except BaseException as exc:  # re-raised in the caller's thread
                out.put((False, exc))

        with self._lock:
            if not self._open:
                raise _ClosedError
            self._calls.put(job)
        ok, value = out.get()
        if not ok:
            raise value
        result: T = value
        return result

    def close(self) -> None:
        with self._lock:
            self._open = False
            self._calls.put(None)
        self._thread.join()


_RESIDENT: dict[str, _Resident] = {}


@contextmanager
def resident_netns(names: Iterable[str]) -> Iterator[None]:
    """While open, :func:`call_in_netns` runs its calls for these namespaces on a thread
    that joined each one beforehand, instead of starting one per call.

    For a fault applied at a chosen instant: starting a thread and joining a namespace is
    half a millisecond of CPU idle and more under load, all of it taken from the transfer
    being measured.  Namespaces already resident stay with their first owner."""
    mine: list[_Resident] = []
    try:
        for name in dict.fromkeys(names):
            if name not in _RESIDENT:
                _RESIDENT[name] = resident = _Resident(name)
                mine.append(resident)
        yield
    finally:
        for resident in mine:
            del _RESIDENT[resident.netns]
            resident.close()


def _setns(netns: str) -> None:
    path = os.path.join(NETNS_DIR, netns)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TestbedError(f"network namespace {netns} does not exist ({path})") from None
    try:
        if _LIBC.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise TestbedError(f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)


_LIBC = ctypes.CDLL(None, use_errno=True)
