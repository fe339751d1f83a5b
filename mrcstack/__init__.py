"""mrcstack: a reference open implementation of MRC (Multipath Reliable Connection)."""

__version__ = "0.1.0"
