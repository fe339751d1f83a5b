"""Data-path workers: processes that each run the transport for a shard of the QPs.

:mod:`.pool` (in the daemon's process) owns the plane sockets, starts and restarts the
workers and stands in for their connections (:class:`.remote.RemoteConnection`);
:mod:`.process` is a worker's own loop; :mod:`.messages` what they tell each other over
:mod:`.channel`.
"""
