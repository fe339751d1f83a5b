"""The node: the QPs, listeners, ports and profiles one mrcd runs, behind both API servers.

:mod:`.node` owns the sans-IO connections and drives the data path and the control channel;
:mod:`.qps`, :mod:`.listeners`, :mod:`.ports` and :mod:`.profiles` hold its state;
:mod:`.snapshot` is the read-only view the metrics exporter scrapes.
"""
