"""Masked-mean token cross-entropy: the reference definition here, the fast paths reuse the log-prob kernels."""
