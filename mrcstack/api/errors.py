"""The one error type of the application and controller APIs: a message and an errno."""

from __future__ import annotations

import errno as _errno

from mrcstack.errors import MrcError


class ApiError(MrcError):
    """A call failed: ``str(err)`` is one line saying why, ``err.errno`` an errno code.

    The daemon raises the same type internally and sends both fields back, so a client sees
    the daemon's own message (``unknown lkey 0x7``), never a generic failure.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.errno = code
        self.message = message

    @property
    def errname(self) -> str:
        """The symbolic errno name (``EINVAL``), as mrc.h documents its failures."""
        return _errno.errorcode.get(self.errno, f"E{self.errno}")

    def __reduce__(self) -> tuple[type[ApiError], tuple[int, str]]:
        return (type(self), (self.errno, self.message))


def invalid(message: str) -> ApiError:
    return ApiError(_errno.EINVAL, message)
