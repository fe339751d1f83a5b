"""nftables rule sets loaded from inside this process, through ``libnftables``.

The ``nft`` program is a front end to this library.  Running it for a fault costs a fork,
an exec, a namespace switch and the program's start-up: 15-25 ms of CPU on a loaded 2-core
machine, time in which a transfer being measured shares the CPU with the fault harness.
Here a thread joins the namespace (:func:`~mrcstack.netns.run.call_in_netns`) and hands the
same text to ``nft_run_cmd_from_buffer``, as ``nft -f -`` does.  Where the library cannot
be loaded, :func:`available` is False and callers run the ``nft`` program instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

from mrcstack.netns.run import TestbedError, call_in_netns, one_line

LIBRARY = "libnftables.so.1"
NFT_CTX_DEFAULT = 0


@cache
def _lib() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError:
        return None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


def available() -> bool:
    """True if ``libnftables`` can be loaded here."""
    return _lib() is not None


def run(netns: str, script: str) -> None:
    """Run an nftables ``script`` (the text ``nft -f`` reads) in network namespace
    ``netns``; TestbedError with nft's own message if it fails."""
    lib = _lib()
    if lib is None:
        raise TestbedError(f"{LIBRARY} cannot be loaded: install nftables")

    def body() -> str | None:
        ctx = lib.nft_ctx_new(NFT_CTX_DEFAULT)
        if not ctx:
            return "nft_ctx_new failed"
        try:
            # Buffered, so nothing is printed and the error text can be returned.
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            if lib.nft_run_cmd_from_buffer(ctx, script.encode()) == 0:
                return None
            err = lib.nft_ctx_get_error_buffer(ctx)
            return (err or b"").decode(errors="replace") or "failed"
        finally:
            lib.nft_ctx_free(ctx)

    error = call_in_netns(netns, body)
    if error is not None:
        raise TestbedError(f"nft in {netns}: {one_line(error)}")
