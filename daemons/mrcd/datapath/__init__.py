"""The data path: UDP sockets per plane, batched receive, one timer, link watch, EV probes.

Packets come in and go out here (:mod:`.transport`, :mod:`.rxbatch`); :mod:`.linkwatch`
reports NIC link changes from netlink; :mod:`.probes` sends and answers connectionless EV
probes on QPN 0; :mod:`.routes` builds the outer headers of the EV formats mrcd writes
itself (SRv6 with an SRH, STEV).
"""
