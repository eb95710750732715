"""Communication: the process group and accelerator set-up, the fail-fast rendezvous, and the gradient
compression (1-bit, any backend).
"""
