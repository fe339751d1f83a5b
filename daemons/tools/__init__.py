"""perftest-style tools over the application API: ``mrc-write-bw`` and ``mrc-write-lat``.

Like perftest's ``ib_write_bw`` / ``ib_write_lat`` (the tools the MRC paper measured with),
one program is the server (it registers memory and waits) and one the client (it writes).
Both talk only to their local mrcd over its Unix socket; the server's (address, rkey) reach
the client in the connection's private data, so there is no side channel.  See
``docs/tools.md``.

- :mod:`daemons.tools.common`: the private-data handshake, patterns, connection setup, events
- :mod:`daemons.tools.flags`: perftest's flags, one-line errors, exit statuses
- :mod:`daemons.tools.report`: interval series, perftest-like tables, JSON
- :mod:`daemons.tools.write_bw`: ``mrc-write-bw`` (the client: streaming RDMA writes, --verify)
- :mod:`daemons.tools.bw_server`: its server (follows, checks and credits what lands)
- :mod:`daemons.tools.write_lat`: ``mrc-write-lat`` (write-with-immediate ping-pong, both sides)
"""
