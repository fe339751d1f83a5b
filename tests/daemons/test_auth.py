"""The control-channel handshake, in process (sans-IO), and its key files and CLI."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack.daemons.mrcd.config import AuthConfig
from mrcstack.daemons.mrcd.control import auth
from mrcstack.daemons.mrcd.control.auth import (
    MSG2_SIZE,
    TRANSITIONS,
    AuthError,
    Credentials,
    Initiator,
    KeyFileError,
    ReplayCache,
    Responder,
    SessionKeys,
    State,
    generate_keypair,
    load_peer_keys,
    load_private_key,
    load_psk,
    public_key,
)
from mrcstack.errors import LocalError, PeerError
from tests.support import REPO

PSK = bytes(range(32))
OTHER_PSK = bytes(range(1, 33))


def psk(host: str, key: bytes = PSK) -> Credentials:
    return Credentials.from_psk(host, key)


@pytest.fixture(scope="module")
def keypairs() -> dict[str, tuple[bytes, bytes]]:
    return {h: generate_keypair() for h in ("h0", "h1", "h2")}


def kp(keys: dict[str, tuple[bytes, bytes]], host: str) -> Credentials:
    return Credentials.from_keypair(
        host, keys[host][0], {h: pub for h, (_, pub) in keys.items() if h != host}
    )


def run(init: Initiator, resp: Responder) -> tuple[SessionKeys, SessionKeys]:
    msg2 = resp.receive(init.start())
    assert msg2 is not None
    msg3 = init.receive(msg2)
    assert msg3 is not None
    assert resp.receive(msg3) is None
    return init.result, resp.result


def check_mirrored(a: SessionKeys, b: SessionKeys) -> None:
    assert a.send_key == b.recv_key and a.recv_key == b.send_key
    assert a.send_key != a.recv_key
    assert a.session_secret == b.session_secret
    assert len({a.send_key, a.recv_key, a.session_secret}) == 3


# Successful handshakes -------------------------------------------------------------------
def test_psk_handshake_derives_mirrored_keys() -> None:
    init, resp = Initiator(psk("h0"), "h1"), Responder(psk("h1"), replay=ReplayCache())
    a, b = run(init, resp)
    check_mirrored(a, b)
    assert (a.peer_host, b.peer_host) == ("h1", "h0")
    assert init.state is State.DONE and resp.state is State.DONE
    assert "send_key" not in repr(a) and PSK.hex() not in repr(psk("h0"))


def test_keypair_handshake_derives_mirrored_keys(keypairs: dict[str, tuple[bytes, bytes]]) -> None:
    a, b = run(Initiator(kp(keypairs, "h0"), "h1"), Responder(kp(keypairs, "h1")))
    check_mirrored(a, b)
    assert (a.peer_host, b.peer_host) == ("h1", "h0")


def test_every_session_has_fresh_keys() -> None:
    first, _ = run(Initiator(psk("h0"), "h1"), Responder(psk("h1")))
    second, _ = run(Initiator(psk("h0"), "h1"), Responder(psk("h1")))
    assert first.session_secret != second.session_secret
    assert first.send_key != second.send_key


def test_injected_ephemerals_make_the_handshake_deterministic() -> None:
    def once() -> SessionKeys:
        return run(
            Initiator(psk("h0"), "h1", ephemeral=b"\x01" * 32),
            Responder(psk("h1"), ephemeral=b"\x02" * 32),
        )[0]

    assert once() == once()


# Peers without credentials ---------------------------------------------------------------
def test_wrong_psk_gets_nothing() -> None:
    resp = Responder(psk("h1"))
    with pytest.raises(AuthError) as err:
        resp.receive(Initiator(psk("h0", OTHER_PSK), "h1").start())
    assert err.value.reason == "bad_mac"
    assert resp.state is State.FAILED
    with pytest.raises(LocalError):
        _ = resp.result


def test_initiator_rejects_a_responder_without_the_key() -> None:
    """A fake server that cannot compute the keys cannot forge message 2."""
    init = Initiator(psk("h0"), "h1")
    init.start()
    with pytest.raises(AuthError) as err:
        init.receive(public_key(os.urandom(32)) + os.urandom(32))
    assert err.value.reason == "bad_mac"
    assert init.state is State.FAILED


def test_unknown_peer_key(keypairs: dict[str, tuple[bytes, bytes]]) -> None:
    stranger_priv, _ = generate_keypair()
    stranger = Credentials.from_keypair("h7", stranger_priv, {"h1": keypairs["h1"][1]})
    with pytest.raises(AuthError) as err:
        Responder(kp(keypairs, "h1")).receive(Initiator(stranger, "h1").start())
    assert err.value.reason == "unknown_peer"


def test_impersonation_with_a_wrong_static_key(keypairs: dict[str, tuple[bytes, bytes]]) -> None:
    """Someone claiming to be h0 without h0's private key."""
    fake_priv, _ = generate_keypair()
    fake = Credentials.from_keypair("h0", fake_priv, {"h1": keypairs["h1"][1]})
    with pytest.raises(AuthError) as err:
        Responder(kp(keypairs, "h1")).receive(Initiator(fake, "h1").start())
    assert err.value.reason == "bad_mac"


def test_initiator_with_a_wrong_key_for_the_responder(
    keypairs: dict[str, tuple[bytes, bytes]],
) -> None:
    """h0 has a stale public key for h1: the real h1 cannot verify message 1."""
    _, stale = generate_keypair()
    creds = Credentials.from_keypair("h0", keypairs["h0"][0], {"h1": stale})
    with pytest.raises(AuthError) as err:
        Responder(kp(keypairs, "h1")).receive(Initiator(creds, "h1").start())
    assert err.value.reason == "bad_mac"


def test_mode_mismatch(keypairs: dict[str, tuple[bytes, bytes]]) -> None:
    with pytest.raises(AuthError) as err:
        Responder(kp(keypairs, "h1")).receive(Initiator(psk("h0"), "h1").start())
    assert err.value.reason == "mode"


# Identity --------------------------------------------------------------------------------
def test_identity_mismatch_wrong_responder() -> None:
    """h0 wants h2 but reached h1 (stale address, or a redirect)."""
    with pytest.raises(AuthError) as err:
        Responder(psk("h1")).receive(Initiator(psk("h0"), "h2").start())
    assert err.value.reason == "identity"


def test_identity_is_bound_into_the_mac() -> None:
    """Rewriting the claimed names in message 1 breaks its tag."""
    msg1 = bytearray(Initiator(psk("h0"), "h2").start())
    at = msg1.index(b"h2")
    msg1[at + 1] = ord("1")  # now asks for h1
    with pytest.raises(AuthError) as err:
        Responder(psk("h1")).receive(bytes(msg1))
    assert err.value.reason == "bad_mac"


def test_reflection_of_message_1_to_the_sender() -> None:
    """h0's own message 1 sent back to h0's server: it names h1 as the responder."""
    msg1 = Initiator(psk("h0"), "h1").start()
    with pytest.raises(AuthError) as err:
        Responder(psk("h0")).receive(msg1)
    assert err.value.reason == "identity"


def test_peer_claiming_to_be_us() -> None:
    """Message 1 naming the responder as both ends (a self-reflection): refused before any
    key check, and an initiator refuses to build one."""
    name = b"\x02h1"
    msg1 = auth.MAGIC + bytes([auth.VERSION, auth.Mode.PSK]) + name + name + os.urandom(64)
    with pytest.raises(AuthError) as err:
        Responder(psk("h1")).receive(msg1)
    assert err.value.reason == "identity"
    with pytest.raises(LocalError):
        Initiator(psk("h1"), "h1")


def test_reflection_of_message_2_as_message_3() -> None:
    resp = Responder(psk("h1"))
    msg2 = resp.receive(Initiator(psk("h0"), "h1").start())
    assert msg2 is not None
    with pytest.raises(AuthError) as err:
        resp.receive(msg2)
    assert err.value.reason == "malformed"
    # The tag part alone has the right size but the wrong label and key.
    resp = Responder(psk("h1"))
    msg2 = resp.receive(Initiator(psk("h0"), "h1").start())
    assert msg2 is not None
    with pytest.raises(AuthError) as err:
        resp.receive(msg2[32:])
    assert err.value.reason == "bad_mac"


def test_reflection_of_message_1_to_the_initiator() -> None:
    init = Initiator(psk("h0"), "h1")
    msg1 = init.start()
    with pytest.raises(AuthError):
        init.receive(msg1)


# Replay ----------------------------------------------------------------------------------
def test_replayed_message_1_is_refused_by_the_cache() -> None:
    cache = ReplayCache()
    init = Initiator(psk("h0"), "h1")
    msg1 = init.start()
    assert Responder(psk("h1"), replay=cache).receive(msg1) is not None
    with pytest.raises(AuthError) as err:
        Responder(psk("h1"), replay=cache).receive(msg1)
    assert err.value.reason == "replay"


def test_replayed_handshake_past_the_cache_cannot_finish() -> None:
    """A recorded message 1 that aged out of the cache gets a fresh message 2; the recorded
    message 3 does not confirm it."""
    init, resp = Initiator(psk("h0"), "h1"), Responder(psk("h1"))
    msg1 = init.start()
    msg2 = resp.receive(msg1)
    assert msg2 is not None
    msg3 = init.receive(msg2)
    assert msg3 is not None
    resp.receive(msg3)

    replayed = Responder(psk("h1"), replay=ReplayCache())
    fresh_msg2 = replayed.receive(msg1)
    assert fresh_msg2 is not None and fresh_msg2 != msg2
    with pytest.raises(AuthError) as err:
        replayed.receive(msg3)
    assert err.value.reason == "bad_mac"


def test_replayed_message_2_to_a_new_initiator() -> None:
    init, resp = Initiator(psk("h0"), "h1"), Responder(psk("h1"))
    msg2 = resp.receive(init.start())
    assert msg2 is not None
    other = Initiator(psk("h0"), "h1")
    other.start()
    with pytest.raises(AuthError) as err:
        other.receive(msg2)
    assert err.value.reason == "bad_mac"


def test_replay_cache_is_bounded() -> None:
    cache = ReplayCache(capacity=2)
    assert cache.check_and_add(b"a") and cache.check_and_add(b"b")
    assert not cache.check_and_add(b"a")
    assert cache.check_and_add(b"c")  # evicts a
    assert len(cache) == 2 and cache.check_and_add(b"a")


# Tampering and garbage -------------------------------------------------------------------
@pytest.mark.parametrize("which", ["msg1", "msg2", "msg3"])
def test_every_flipped_bit_position_is_caught(which: str) -> None:
    base_init = Initiator(psk("h0"), "h1", ephemeral=b"\x03" * 32)
    msg1 = base_init.start()
    base_resp = Responder(psk("h1"), ephemeral=b"\x04" * 32)
    msg2 = base_resp.receive(msg1)
    assert msg2 is not None
    msg3 = base_init.receive(msg2)
    assert msg3 is not None
    target = {"msg1": msg1, "msg2": msg2, "msg3": msg3}[which]
    for pos in range(len(target)):
        bad = bytearray(target)
        bad[pos] ^= 0x01
        init = Initiator(psk("h0"), "h1", ephemeral=b"\x03" * 32)
        resp = Responder(psk("h1"), ephemeral=b"\x04" * 32)
        with pytest.raises(AuthError):
            if which == "msg1":
                resp.receive(bytes(bad))
            elif which == "msg2":
                init.start()
                init.receive(bytes(bad))
            else:
                resp.receive(init.start())
                resp.receive(bytes(bad))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"GET / HTTP/1.1\r\n\r\n",
        b"MRCC",
        b"\x00" * 300,
        os.urandom(120),
        b"MRCC\x02" + bytes(90),
    ],
)
def test_garbage_message_1(data: bytes) -> None:
    with pytest.raises(AuthError):
        Responder(psk("h1")).receive(data)


def test_low_order_ephemeral_is_refused() -> None:
    init = Initiator(psk("h0"), "h1")
    init.start()
    with pytest.raises(AuthError) as err:
        init.receive(bytes(MSG2_SIZE))
    assert err.value.reason == "bad_key"


# State machine ---------------------------------------------------------------------------
def test_misuse_is_a_local_error() -> None:
    init = Initiator(psk("h0"), "h1")
    with pytest.raises(LocalError):
        init.receive(b"x" * 64)  # before start
    init.start()
    with pytest.raises(LocalError):
        init.start()
    with pytest.raises(LocalError):
        _ = init.result
    resp = Responder(psk("h1"))
    with pytest.raises(AuthError):
        resp.receive(b"junk")
    with pytest.raises(LocalError):  # a failed handshake stays failed
        resp.receive(b"junk")


def test_transition_table_reaches_done_for_both_roles() -> None:
    for role in auth.Role:
        state = State.START if role is auth.Role.INITIATOR else State.WAIT_MSG1
        steps = 0
        while state is not State.DONE:
            state = next(v for (r, s, _), v in TRANSITIONS.items() if r is role and s is state)
            steps += 1
        assert steps == 2
    assert issubclass(AuthError, PeerError) and not issubclass(AuthError, LocalError)


def test_keypair_initiator_needs_the_peer_key(keypairs: dict[str, tuple[bytes, bytes]]) -> None:
    with pytest.raises(LocalError):
        Initiator(kp(keypairs, "h0"), "h9")


# Key files and the CLI -------------------------------------------------------------------
def test_load_psk(tmp_path: Path) -> None:
    good = tmp_path / "cluster.key"
    good.write_text(PSK.hex().upper() + "\n")
    assert load_psk(good) == PSK
    for name, text in (("short", "abcd"), ("nothex", "zz" * 32), ("long", PSK.hex() + "00")):
        bad = tmp_path / name
        bad.write_text(text)
        with pytest.raises(KeyFileError) as err:
            load_psk(bad)
        assert str(bad) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_psk(tmp_path / "missing")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff" * 64)
    with pytest.raises(KeyFileError):
        load_psk(binary)


def test_cli_genkey_and_genpsk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    assert auth.main(["genkey", "--out", str(keys), "--host", "h0"]) == 0
    assert auth.main(["genkey", "--out", str(keys), "--host", "h1"]) == 0
    for name in ("h0.key", "h0.pub", "h1.key", "h1.pub"):
        assert stat.S_IMODE((keys / name).stat().st_mode) == 0o600
    private = load_private_key(keys / "h0.key")
    peers = load_peer_keys(keys)
    assert set(peers) == {"h0", "h1"} and peers["h0"] == public_key(private)

    # Refuses to overwrite without --force; one line on stderr.
    capsys.readouterr()
    assert auth.main(["genkey", "--out", str(keys), "--host", "h0"]) == 1
    err = capsys.readouterr().err
    assert "exists" in err and err.count("\n") == 1
    assert auth.main(["genkey", "--out", str(keys), "--host", "h0", "--force"]) == 0
    assert load_private_key(keys / "h0.key") != private
    assert auth.main(["genkey", "--out", str(keys), "--host", "bad/name"]) == 1

    cluster = tmp_path / "cluster.key"
    assert auth.main(["genpsk", "--out", str(cluster)]) == 0
    assert stat.S_IMODE(cluster.stat().st_mode) == 0o600
    assert len(load_psk(cluster)) == 32
    assert auth.main(["genpsk", "--out", str(cluster)]) == 1

    # The files work as configured credentials.
    a = Credentials.from_config(
        "h0", AuthConfig(mode="keypair", private_key_file=keys / "h0.key", peer_keys_dir=keys)
    )
    b = Credentials.from_config(
        "h1", AuthConfig(mode="keypair", private_key_file=keys / "h1.key", peer_keys_dir=keys)
    )
    check_mirrored(*run(Initiator(a, "h1"), Responder(b)))
    c = Credentials.from_config("h0", AuthConfig(mode="psk", psk_file=cluster))
    d = Credentials.from_config("h1", AuthConfig(mode="psk", psk_file=cluster))
    check_mirrored(*run(Initiator(c, "h1"), Responder(d)))


def test_load_peer_keys_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot list"):
        load_peer_keys(tmp_path / "missing")
    (tmp_path / "README").write_text("ignored")
    (tmp_path / "h1.pub").write_text(bytes(32).hex())
    with pytest.raises(KeyFileError, match="all zeros"):
        load_peer_keys(tmp_path)
    (tmp_path / "h1.pub").write_text(generate_keypair()[1].hex())
    (tmp_path / "bad name!.pub").write_text(generate_keypair()[1].hex())
    with pytest.raises(KeyFileError, match=r"not <host>\.pub"):
        load_peer_keys(tmp_path)


def test_docs_state_table_is_generated_from_the_code() -> None:
    doc = REPO / "docs" / "control-channel.md"
    assert auth.transitions_markdown() in doc.read_text()


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from([b"", auth.MAGIC, auth.MAGIC + b"\x01\x01", auth.MAGIC + b"\x01\x02"]),
    data=st.binary(max_size=300),
)
def test_random_message_1_only_raises_auth_error(prefix: bytes, data: bytes) -> None:
    with pytest.raises(AuthError):
        Responder(psk("h1")).receive(prefix + data)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=100))
def test_random_message_2_and_3_only_raise_auth_error(data: bytes) -> None:
    init = Initiator(psk("h0"), "h1")
    resp = Responder(psk("h1"))
    assert resp.receive(init.start()) is not None
    with pytest.raises(AuthError):
        init.receive(data)
    with pytest.raises(AuthError):
        resp.receive(data)
