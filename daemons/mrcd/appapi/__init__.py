"""The application API server (OCP ``mrc.h``): mrcd's Unix socket, its sessions and their QPs.

:mod:`.server` accepts clients and routes requests (``ctl.*`` to the controller API),
:mod:`.session` holds one client's context, regions, CQs and QPs, :mod:`.qp` its QPs.
"""
