"""mrcd: the endpoint daemon and node controller.

Where things live (each layer imports only the ones below it; ``make lint`` checks this):

- :mod:`.ops`: the ``mrcd`` command, Prometheus metrics, a Prometheus server for demos
- :mod:`.appapi`: the application API server (``mrc.h``) on the Unix socket
- :mod:`.ctlapi`: the controller API (``mrc_ctl.h``)
- :mod:`.node`: QPs, listeners, ports and profiles: the state behind both APIs
- :mod:`.datapath`: UDP sockets per plane, batched receive, the timer, link watch, probes
- :mod:`.control`: the daemon-to-daemon control channel (authentication, records)
- :mod:`.config` (the configuration file) and :mod:`.apiargs` (API argument checks)
"""
