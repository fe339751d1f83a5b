"""Mutual authentication for the mrcd control channel: key files and a sans-IO handshake.

Two modes share one three-message handshake (docs/control-channel.md draws it):

- ``psk``: every mrcd holds the same 32-byte cluster key; both ends prove they know it.
- ``keypair``: every host has a static X25519 key pair and knows its peers' public keys; both
  ends prove they hold their static private key.

Each handshake adds fresh ephemeral X25519 keys (forward secrecy), feeds everything through
HKDF-SHA256 salted with a running transcript hash, and confirms the keys with HMAC-SHA256 tags
over that hash, so a message only verifies inside the exact exchange it was made for.  The
initiator names itself and the host it wants; the responder refuses any other name.

The state machines are pure: no sockets, no clock.  Ephemeral keys come from the OS random
generator unless the caller passes them in (tests).  Errors say whose fault they are:
:class:`AuthError` for anything the peer sent, :class:`LocalError` for misuse or bad local
key material.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import hmac
import os
import re
import secrets
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mrcstack.errors import LocalError, PeerError

if TYPE_CHECKING:
    from mrcstack.daemons.mrcd.config import AuthConfig

_T = TypeVar("_T")

KEY_SIZE = 32  # PSK, X25519 keys, HKDF outputs
TAG_SIZE = 32  # HMAC-SHA256
MAGIC = b"MRCC"
VERSION = 1
PROTOCOL = b"mrcstack control v1"
HOST_NAME_MAX = 64
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Largest handshake message (msg1 with two 64-byte host names); the framing refuses more
#: before the peer has authenticated.
MAX_HANDSHAKE_MESSAGE = 256
MSG2_SIZE = KEY_SIZE + TAG_SIZE
MSG3_SIZE = TAG_SIZE
REPLAY_CACHE_SIZE = 16384


class Mode(enum.IntEnum):
    """The byte in message 1 that says which credentials the initiator uses."""

    PSK = 1
    KEYPAIR = 2


#: AuthError reasons that mean the peer's credentials did not check out: authentication
#: failures.  The others (``malformed``, ``version``) mean it did not speak our handshake.
CREDENTIAL_FAILURES = frozenset(
    {"bad_key", "unknown_peer", "bad_mac", "mode", "identity", "replay"}
)


class AuthError(PeerError):
    """The peer failed the handshake.  ``reason`` is a short code for counters and logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def credentials(self) -> bool:
        """True if the peer failed authentication (not just the handshake's format)."""
        return self.reason in CREDENTIAL_FAILURES


class KeyFileError(LocalError, ValueError):
    """Bad local key material; ``str()`` is one line naming the file."""


# Key files --------------------------------------------------------------------------------
def _read_hex(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        text = Path(path).read_text(encoding="ascii")
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read {what}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: {what} is not hex text") from None
    digits = text.strip()
    if len(digits) != 2 * KEY_SIZE or not re.fullmatch(r"[0-9a-fA-F]+", digits):
        raise KeyFileError(f"{path}: {what} must be {2 * KEY_SIZE} hex digits ({KEY_SIZE} bytes)")
    return bytes.fromhex(digits)


def load_psk(path: str | os.PathLike[str]) -> bytes:
    """The cluster key: 32 bytes as 64 hex digits on one line."""
    return _read_hex(path, "cluster key")


def load_private_key(path: str | os.PathLike[str]) -> bytes:
    """This host's static X25519 private key (raw 32 bytes, hex)."""
    return _read_hex(path, "private key")


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    key = _read_hex(path, "public key")
    if key == bytes(KEY_SIZE):
        raise KeyFileError(f"{path}: public key is all zeros")
    return key


def load_peer_keys(directory: str | os.PathLike[str]) -> dict[str, bytes]:
    """Peers' public keys: one ``<host>.pub`` (hex) per host; other files are ignored."""
    folder = Path(directory)
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise KeyFileError(f"{folder}: cannot list peer keys: {exc.strerror}") from None
    keys: dict[str, bytes] = {}
    for entry in entries:
        if entry.suffix != ".pub" or not entry.is_file():
            continue
        if not HOST_NAME.fullmatch(entry.stem):
            raise KeyFileError(f"{entry}: file name is not <host>.pub")
        keys[entry.stem] = load_public_key(entry)
    return keys


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh static X25519 key pair: ``(private_bytes, public_bytes)``, 32 bytes each."""
    private = X25519PrivateKey.generate()
    return _raw_private(private), _raw_public(private.public_key())


def public_key(private: bytes) -> bytes:
    return _raw_public(X25519PrivateKey.from_private_bytes(private).public_key())


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _check_host(name: str, what: str) -> None:
    if not HOST_NAME.fullmatch(name):
        raise LocalError(f"{what} {name!r} is not a host name ([A-Za-z0-9._-], at most 64)")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What one mrcd proves itself with, loaded once at start.

    ``psk`` in psk mode; ``private_key`` and ``peer_keys`` (host name -> public key) in keypair
    mode.  The secrets stay out of ``repr``.
    """

    host: str
    mode: Mode
    psk: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    peer_keys: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_host(self.host, "host")
        if self.mode is Mode.PSK and (self.psk is None or len(self.psk) != KEY_SIZE):
            raise LocalError(f"psk mode needs a {KEY_SIZE}-byte cluster key")
        if self.mode is Mode.KEYPAIR and (
            self.private_key is None or len(self.private_key) != KEY_SIZE
        ):
            raise LocalError(f"keypair mode needs a {KEY_SIZE}-byte private key")
        for name, key in self.peer_keys.items():
            _check_host(name, "peer")
            if len(key) != KEY_SIZE:
                raise LocalError(f"public key of {name} is not {KEY_SIZE} bytes")

    def probe_key(self, peer: str) -> bytes | None:
        """The key EV probes between this host and ``peer`` are sealed with (AES-GCM), the
        same at both ends; None when there is no key for ``peer`` (keypair mode, no public
        key).  PSK: derived from the cluster key; keypair: from the static X25519 secret."""
        _check_host(peer, "peer")
        pair = b"|".join(_encode_host(h) for h in sorted((self.host, peer)))
        if self.mode is Mode.PSK:
            assert self.psk is not None  # checked in __post_init__
            return _hkdf(self.psk, b"mrcstack ev probe", pair)
        public = self.peer_keys.get(peer)
        if public is None or self.private_key is None:
            return None
        secret = _dh(X25519PrivateKey.from_private_bytes(self.private_key), public)
        return _hkdf(secret, b"mrcstack ev probe", pair)

    @classmethod
    def from_psk(cls, host: str, psk: bytes) -> Credentials:
        return cls(host, Mode.PSK, psk=psk)

    @classmethod
    def from_keypair(
        cls, host: str, private_key: bytes, peer_keys: Mapping[str, bytes]
    ) -> Credentials:
        return cls(host, Mode.KEYPAIR, private_key=private_key, peer_keys=dict(peer_keys))

    @classmethod
    def from_config(cls, host: str, auth: AuthConfig) -> Credentials:
        """Load the files an ``[mrcd.auth]`` table names (:class:`KeyFileError` on trouble,
        one line naming the config key and the file)."""
        if auth.mode == "psk":
            if auth.psk_file is None:
                raise KeyFileError("mrcd.auth.psk_file: required in psk mode")
            return cls.from_psk(host, _load("psk_file", load_psk, auth.psk_file))
        if auth.mode == "keypair":
            if auth.private_key_file is None or auth.peer_keys_dir is None:
                raise KeyFileError("mrcd.auth: keypair mode needs private_key_file, peer_keys_dir")
            private = _load("private_key_file", load_private_key, auth.private_key_file)
            peers = _load("peer_keys_dir", load_peer_keys, auth.peer_keys_dir)
            return cls.from_keypair(host, private, peers)
        raise KeyFileError(f"mrcd.auth.mode: unknown mode {auth.mode!r}")


def _load(key: str, loader: Callable[[Path], _T], path: Path) -> _T:
    """``loader(path)``, its error prefixed with the ``[mrcd.auth]`` key that named the file."""
    try:
        return loader(path)
    except KeyFileError as exc:
        raise KeyFileError(f"mrcd.auth.{key}: {exc}") from None


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """A finished handshake: direction keys for the record layer and the session secret
    per-QP keys derive from.  ``peer_host`` is the authenticated name of the other end."""

    send_key: bytes = field(repr=False)
    recv_key: bytes = field(repr=False)
    session_secret: bytes = field(repr=False)
    peer_host: str


class ReplayCache:
    """Initiator ephemeral keys a responder has already answered (bounded, oldest evicted).

    A replayed message 1 is refused before anything is sent back.  One that has aged out of
    the cache still gets nothing useful: message 2 answers a fresh ephemeral key, and the
    recorded message 3 cannot confirm it.
    """

    def __init__(self, capacity: int = REPLAY_CACHE_SIZE) -> None:
        if capacity < 1:
            raise LocalError("replay cache capacity must be >= 1")
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, key: bytes) -> bool:
        """True if ``key`` is new (and now remembered); False if it was seen before."""
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._seen)


# The handshake ----------------------------------------------------------------------------
class Role(enum.Enum):
    INITIATOR = "initiator"
    RESPONDER = "responder"


class State(enum.Enum):
    START = "start"
    WAIT_MSG1 = "wait_msg1"
    WAIT_MSG2 = "wait_msg2"
    WAIT_MSG3 = "wait_msg3"
    DONE = "done"
    FAILED = "failed"


#: Every legal transition: (role, state, input) -> next state.  An input missing here is
#: local misuse; a peer message that fails its checks moves the machine to FAILED instead.
TRANSITIONS: dict[tuple[Role, State, str], State] = {
    (Role.INITIATOR, State.START, "start"): State.WAIT_MSG2,  # sends msg1
    (Role.INITIATOR, State.WAIT_MSG2, "msg2"): State.DONE,  # sends msg3
    (Role.RESPONDER, State.WAIT_MSG1, "msg1"): State.WAIT_MSG3,  # sends msg2
    (Role.RESPONDER, State.WAIT_MSG3, "msg3"): State.DONE,
}


def transitions_markdown() -> str:
    """The handshake state table as Markdown; docs/control-channel.md embeds it (a test keeps
    them equal).  Any input failing its checks leads to FAILED instead."""
    lines = ["| role | state | input | new state |", "|---|---|---|---|"]
    for (role, state, event), new in TRANSITIONS.items():
        lines.append(f"| {role.value} | {state.name} | `{event}` | {new.name} |")
    return "\n".join(lines) + "\n"


def _hash(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_SIZE) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def _mac(key: bytes, label: bytes, th: bytes) -> bytes:
    return hmac.new(key, label + th, hashlib.sha256).digest()


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:  # a low-order point gives the all-zero secret; cryptography refuses it
        raise AuthError("bad_key", "low-order public key") from None


def _encode_host(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes([len(raw)]) + raw


class _Handshake:
    role: Role

    def __init__(self, creds: Credentials, ephemeral: bytes | None) -> None:
        self.creds = creds
        self.state = State.START
        self._e = (
            X25519PrivateKey.from_private_bytes(ephemeral)
            if ephemeral is not None
            else X25519PrivateKey.generate()
        )
        self._static = (
            X25519PrivateKey.from_private_bytes(creds.private_key)
            if creds.private_key is not None
            else None
        )
        self._th = _hash(PROTOCOL)
        self._keys: SessionKeys | None = None
        self._confirm_i = b""
        self._peer_name = ""

    @property
    def done(self) -> bool:
        return self.state is State.DONE

    @property
    def result(self) -> SessionKeys:
        if self._keys is None or self.state is not State.DONE:
            raise LocalError(f"handshake not finished ({self.state.value})")
        return self._keys

    def _advance(self, event: str) -> State:
        """Check that ``event`` is legal now; returns the state to enter once it succeeds."""
        nxt = TRANSITIONS.get((self.role, self.state, event))
        if nxt is None:
            raise LocalError(f"{self.role.value}: {event} is not allowed in {self.state.value}")
        return nxt

    def _fail(self, exc: AuthError) -> AuthError:
        self.state = State.FAILED
        self._keys = None
        return exc

    def _base_secret(self, peer: str) -> bytes:
        """What proves membership before any ephemeral: the PSK, or static-static DH."""
        if self.creds.mode is Mode.PSK:
            if self.creds.psk is None:
                raise LocalError("psk mode without a cluster key")
            return self.creds.psk
        return _dh(self._static_key(), self._peer_static(peer))

    def _static_key(self) -> X25519PrivateKey:
        if self._static is None:
            raise LocalError("keypair mode without a private key")
        return self._static

    def _peer_static(self, peer: str) -> bytes:
        key = self.creds.peer_keys.get(peer)
        if key is None:
            raise AuthError("unknown_peer", f"no public key for {peer!r}")
        return key

    def _msg1_tag(self, base: bytes, body: bytes) -> bytes:
        self._th = _hash(self._th, body)
        k1 = _hkdf(base, self._th, b"mrc ctl msg1")
        return _mac(k1, b"initiator hello", self._th)

    def _schedule(self, base: bytes, tag1: bytes, e_r: bytes, dhs: list[bytes]) -> bytes:
        """Mix message 2's key in; returns the responder's confirmation key."""
        self._th = _hash(self._th, tag1, e_r)
        okm = _hkdf(base + b"".join(dhs), self._th, b"mrc ctl keys", 5 * KEY_SIZE)
        k = [okm[i : i + KEY_SIZE] for i in range(0, len(okm), KEY_SIZE)]
        confirm_r, self._confirm_i, i2r, r2i, secret = k
        peer = self._peer_name
        if self.role is Role.INITIATOR:
            self._keys = SessionKeys(i2r, r2i, secret, peer)
        else:
            self._keys = SessionKeys(r2i, i2r, secret, peer)
        return confirm_r


class Initiator(_Handshake):
    """The connecting side: ``start()`` -> message 1; ``receive(msg2)`` -> message 3."""

    role = Role.INITIATOR

    def __init__(self, creds: Credentials, peer_host: str, *, ephemeral: bytes | None = None):
        super().__init__(creds, ephemeral)
        _check_host(peer_host, "peer")
        if peer_host == creds.host:
            raise LocalError(f"{peer_host} cannot open a control session to itself")
        if creds.mode is Mode.KEYPAIR and peer_host not in creds.peer_keys:
            raise LocalError(f"no public key for {peer_host} (keypair mode)")
        self._peer_name = peer_host
        self._base = b""
        self._tag1 = b""

    def start(self) -> bytes:
        nxt = self._advance("start")
        body = (
            MAGIC
            + bytes([VERSION, self.creds.mode])
            + _encode_host(self.creds.host)
            + _encode_host(self._peer_name)
            + _raw_public(self._e.public_key())
        )
        self._base = self._base_secret(self._peer_name)
        self._tag1 = self._msg1_tag(self._base, body)
        self.state = nxt
        return body + self._tag1

    def receive(self, data: bytes) -> bytes | None:
        nxt = self._advance("msg2")
        try:
            if len(data) != MSG2_SIZE:
                raise AuthError("malformed", f"message 2 is {len(data)} bytes")
            e_r, tag2 = data[:KEY_SIZE], data[KEY_SIZE:]
            dhs = [_dh(self._e, e_r)]
            if self.creds.mode is Mode.KEYPAIR:
                dhs.append(_dh(self._e, self._peer_static(self._peer_name)))  # responder static
                dhs.append(_dh(self._static_key(), e_r))  # our static, fresh
            confirm_r = self._schedule(self._base, self._tag1, e_r, dhs)
            if not hmac.compare_digest(tag2, _mac(confirm_r, b"responder", self._th)):
                raise AuthError("bad_mac", "message 2 does not confirm the keys")
            self._th = _hash(self._th, tag2)
            tag3 = _mac(self._confirm_i, b"initiator", self._th)
        except AuthError as exc:
            raise self._fail(exc) from None
        self.state = nxt
        return tag3


class Responder(_Handshake):
    """The listening side: ``receive(msg1)`` -> message 2; ``receive(msg3)`` -> None (done).

    ``replay`` is shared by all of one server's handshakes.
    """

    role = Role.RESPONDER

    def __init__(
        self,
        creds: Credentials,
        *,
        replay: ReplayCache | None = None,
        ephemeral: bytes | None = None,
    ) -> None:
        super().__init__(creds, ephemeral)
        self.state = State.WAIT_MSG1
        self._replay = replay

    @property
    def peer_host(self) -> str | None:
        """The name the initiator claimed (verified only once the handshake is done)."""
        return self._peer_name or None

    def receive(self, data: bytes) -> bytes | None:
        nxt = self._advance("msg1" if self.state is State.WAIT_MSG1 else "msg3")
        out: bytes | None = None
        try:
            if self.state is State.WAIT_MSG1:
                out = self._on_msg1(data)
            else:
                self._on_msg3(data)
        except AuthError as exc:
            raise self._fail(exc) from None
        self.state = nxt
        return out

    def _on_msg1(self, data: bytes) -> bytes:
        body, tag1 = _parse_msg1(data)
        mode, i_host, r_host, e_i = body.mode, body.initiator, body.responder, body.ephemeral
        if mode is not self.creds.mode:
            raise AuthError("mode", f"peer uses {mode.name.lower()} mode")
        if r_host != self.creds.host:
            raise AuthError("identity", f"{i_host} wants {r_host!r}, this is {self.creds.host}")
        if i_host == self.creds.host:
            raise AuthError("identity", f"peer claims to be this host ({i_host})")
        self._peer_name = i_host
        base = self._base_secret(i_host)
        if not hmac.compare_digest(tag1, self._msg1_tag(base, data[:-TAG_SIZE])):
            raise AuthError("bad_mac", f"message 1 from {i_host!r} fails its key check")
        if self._replay is not None and not self._replay.check_and_add(e_i):
            raise AuthError("replay", f"message 1 from {i_host} seen before")
        e_r = _raw_public(self._e.public_key())
        dhs = [_dh(self._e, e_i)]
        if self.creds.mode is Mode.KEYPAIR:
            dhs.append(_dh(self._static_key(), e_i))  # our static, fresh
            dhs.append(_dh(self._e, self._peer_static(i_host)))  # initiator static
        confirm_r = self._schedule(base, tag1, e_r, dhs)
        tag2 = _mac(confirm_r, b"responder", self._th)
        self._th = _hash(self._th, tag2)
        return e_r + tag2

    def _on_msg3(self, data: bytes) -> None:
        if len(data) != MSG3_SIZE:
            raise AuthError("malformed", f"message 3 is {len(data)} bytes")
        if not hmac.compare_digest(data, _mac(self._confirm_i, b"initiator", self._th)):
            raise AuthError("bad_mac", f"message 3 from {self._peer_name} does not confirm")


@dataclass(frozen=True, slots=True)
class _Msg1:
    mode: Mode
    initiator: str
    responder: str
    ephemeral: bytes


def _parse_msg1(data: bytes) -> tuple[_Msg1, bytes]:
    if len(data) > MAX_HANDSHAKE_MESSAGE or len(data) < len(MAGIC) + 4 + KEY_SIZE + TAG_SIZE:
        raise AuthError("malformed", f"message 1 is {len(data)} bytes")
    if data[: len(MAGIC)] != MAGIC:
        raise AuthError("malformed", "not an mrcd control handshake")
    pos = len(MAGIC)
    if data[pos] != VERSION:
        raise AuthError("version", f"handshake version {data[pos]}")
    try:
        mode = Mode(data[pos + 1])
    except ValueError:
        raise AuthError("malformed", f"unknown mode {data[pos + 1]}") from None
    pos += 2
    names = []
    for _ in range(2):
        n = data[pos]
        raw = data[pos + 1 : pos + 1 + n]
        pos += 1 + n
        name = raw.decode("ascii", "replace")
        if len(raw) != n or not HOST_NAME.fullmatch(name):
            raise AuthError("malformed", "bad host name")
        names.append(name)
    if len(data) - pos != KEY_SIZE + TAG_SIZE:
        raise AuthError("malformed", "message 1 has the wrong length")
    return _Msg1(mode, names[0], names[1], data[pos : pos + KEY_SIZE]), data[-TAG_SIZE:]


# CLI: python -m mrcstack.daemons.mrcd.control.auth genkey|genpsk ----------------------
def _write_secret(path: Path, text: str, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path}: exists (use --force to replace it)") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot write: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="ascii") as out:
        os.fchmod(out.fileno(), 0o600)  # --force on an existing file keeps its old mode
        out.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrcstack.daemons.mrcd.control.auth",
        description="mrcd control-channel key material",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    gk = sub.add_parser("genkey", help="a static X25519 key pair: DIR/HOST.key and DIR/HOST.pub")
    gk.add_argument("--out", required=True, type=Path, help="directory (created if missing)")
    gk.add_argument("--host", required=True, help="host name, e.g. h0")
    gk.add_argument("--force", action="store_true", help="replace existing files")
    gp = sub.add_parser("genpsk", help="a 32-byte cluster key (hex) for psk mode")
    gp.add_argument("--out", required=True, type=Path, help="file to write")
    gp.add_argument("--force", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "genkey":
            _check_host(args.host, "--host")
            try:
                args.out.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise KeyFileError(f"{args.out}: cannot create: {exc.strerror}") from None
            private, public = generate_keypair()
            _write_secret(args.out / f"{args.host}.key", private.hex(), args.force)
            _write_secret(args.out / f"{args.host}.pub", public.hex(), args.force)
            print(f"wrote {args.out / args.host}.key and .pub; copy the .pub to every peer")
        else:
            _write_secret(args.out, secrets.token_bytes(KEY_SIZE).hex(), args.force)
            print(f"wrote {args.out}; copy it to every host over a secure channel")
    except LocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
