"""Triton kernels of the fast path (CUDA), and the oneDNN projections of the CPU path."""
