"""The device side of the KV / state pool: geometry from kern_pool's sizing (`capacity.py`), the VMM arena
and its remaps (`remap.py`), plan execution (`pool_exec.py`), the pinned host tier (`host_tier.py`) and the
runtime's pool API over them.

Internal: the public names are re-exported by `kern_runtime`."""
