"""perftest-style tools over the application API: ``mrc-write-bw`` and ``mrc-write-lat``.

Like perftest's ``ib_write_bw`` / ``ib_write_lat`` (the tools the MRC paper measured with),
one program is the server (it registers memory and waits) and one the client (it writes).
Both talk only to their local mrcd over its Unix socket; the server's (address, rkey) reach
the client in the connection's private data, so there is no side channel.  See
``docs/tools.md``.

- :mod:`.common`: the private-data handshake, patterns, connection setup, completions, events
- :mod:`.flags`: perftest's flags (tables of them), one-line errors, exit statuses
- :mod:`.report`: interval series, perftest-like tables, JSON
- :mod:`.runloop`: the run loop both tools share: a client's runs (one per size of ``-a``)
  and a server's, with headers, reports and exit statuses; each tool brings one run
- :mod:`.write_bw`: ``mrc-write-bw`` (the client: streaming RDMA writes, --verify)
- :mod:`.bw_server`: its server (follows, checks and credits what lands)
- :mod:`.write_lat`: ``mrc-write-lat`` (the client: write-with-immediate ping-pong)
- :mod:`.lat_server`: its server (echoes every write, checks its stamp)
"""
