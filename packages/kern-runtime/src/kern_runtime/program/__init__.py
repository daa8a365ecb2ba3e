"""Programs: call tables compiled once into launch records (`records.py`) over staged parameter blocks
(`params.py`), and their replay.

Internal: the public names are re-exported by `kern_runtime`."""
