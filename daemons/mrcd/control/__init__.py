"""The control channel between daemons: authentication, AES-GCM records, client and server.

:mod:`.auth` (key files, the handshake), :mod:`.records` (frames, records, QP keys),
:mod:`.client` (messages, opening sessions to peers), :mod:`.server` (answering them).
"""
