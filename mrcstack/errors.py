"""Errors that name their side: local misuse versus bad input from the peer."""

from __future__ import annotations


class MrcError(Exception):
    """Base of every mrcstack error."""


class LocalError(MrcError):
    """The local application misused the API (bad argument, unknown region...)."""


class PeerError(MrcError):
    """The peer (or the network) sent something we reject."""


class ConfigError(LocalError, ValueError):
    """A connection or EV table was configured with an impossible value (names the field)."""


class AccessError(PeerError):
    """A remote write does not match a registered region (rkey, range or permission): the
    peer sent it, so it is the peer's fault; the receiver counts it and answers with a NAK."""


class ConnectionFailedError(MrcError):
    """The connection is in the error state; no further work is accepted."""
