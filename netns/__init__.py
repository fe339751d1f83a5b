"""Network-namespace testbeds whose switches forward with the kernel's own SRv6 uSID."""
