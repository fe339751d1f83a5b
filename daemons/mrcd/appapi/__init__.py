"""The application API server (OCP ``mrc.h``): mrcd's Unix socket, its sessions and their QPs.

:mod:`.server` accepts clients and routes requests (``ctl.*`` to the controller API),
:mod:`.session` holds one client's context, regions, CQs and QPs, :mod:`.qp` its QPs;
:mod:`.clientio` is a client's framed socket I/O (with descriptors), :mod:`.views` the
records and narrow views the others share, so they import one way only.
"""
