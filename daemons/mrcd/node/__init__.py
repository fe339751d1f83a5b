"""The node: the QPs, listeners, ports and profiles one mrcd runs, behind both API servers.

:mod:`.node` composes the parts below and owns the lifecycle and the data path;
:mod:`.qptable` keeps contexts and QPs (records in :mod:`.qps`); :mod:`.connect` connects them
over the control channel, with :mod:`.listeners` for the peers' requests; :mod:`.events` fans
their events out; :mod:`.ports`, :mod:`.peers` (peer liveness), :mod:`.probing` (EV probes,
port status), :mod:`.addresses` and :mod:`.profiles` hold the rest of its state;
:mod:`.snapshot` is the read-only view the metrics exporter scrapes.
"""
