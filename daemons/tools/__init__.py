"""perftest-style tools over the application API: ``mrc-write-bw`` and ``mrc-write-lat``.

Like perftest's ``ib_write_bw`` / ``ib_write_lat`` (the tools the MRC paper measured with),
one program is the server (it registers memory and waits) and one the client (it writes).
Both talk only to their local mrcd over its Unix socket; the server's (address, rkey) reach
the client in the connection's private data, so there is no side channel.  See
``docs/tools.md``.

- :mod:`.common`: the private-data handshake, patterns, connection setup, events
- :mod:`.flags`: perftest's flags, one-line errors, exit statuses
- :mod:`.report`: interval series, perftest-like tables, JSON
- :mod:`.write_bw`: ``mrc-write-bw`` (the client: streaming RDMA writes, --verify)
- :mod:`.bw_server`: its server (follows, checks and credits what lands)
- :mod:`.write_lat`: ``mrc-write-lat`` (write-with-immediate ping-pong, both sides)
"""
