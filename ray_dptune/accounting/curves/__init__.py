"""RDP curves and the exact profiles of base mechanisms (Gaussian, DP-SGD)."""
