"""kern-pool: pure-host KV memory management (pages, slots, blocks, prefix tree, host tier, simulator).

Standard library only. The executor (kern-runtime) carries out the plans this package returns.
"""

from .errors import Busy, Closed, ExceedsPool, Misuse, NotLanded, PoolError, Refused, Remapping
from .handles import Checkpoint, Lease
from .host import Host, HostNode, Parked, Room, Waking, host_split, host_units
from .plans import BlockMove, Copies, HostCopies, PageCopy, RemapPlan, SlotCopy
from .pool import Pool
from .prefix import Eviction, Hit, Kept, Prefix, Resident, Tier, check_prefix
from .prefix import Parked as ParkedTier
from .sizing import (
    GRANULARITY_BYTES,
    HEADROOM_BYTES,
    MAX_BLOCK_BYTES,
    Capacity,
    Layout,
    PooledState,
    block_bytes_for,
)

__version__ = "0.1.0"  # the one source of the version: [tool.hatch.version] reads it, the kern pins must equal it
__all__ = [
    "__version__",
    "BlockMove", "Busy", "Capacity", "Checkpoint", "Closed", "Copies", "Eviction", "ExceedsPool",
    "GRANULARITY_BYTES", "HEADROOM_BYTES", "Hit", "Host", "HostCopies", "HostNode", "Kept", "Layout",
    "Lease", "MAX_BLOCK_BYTES", "Misuse", "NotLanded", "PageCopy", "Parked", "ParkedTier", "Pool",
    "PoolError", "PooledState", "Prefix", "Refused", "RemapPlan", "Remapping", "Resident", "Room",
    "SlotCopy", "Tier", "Waking", "block_bytes_for", "check_prefix", "host_split", "host_units",
]
