"""The controller API (OCP ``mrc_ctl.h``): ports, EV format, EV and CC profiles, probes."""
