"""Several GPUs: peer handles, offers and their wire form (`peers.py`), the handshake and NCCL dispatch
(`connect.py`).

Internal: the public names are re-exported by `kern_runtime`."""
