"""kern-runtime: kern's executor.

    import numpy as np
    from kern_runtime import Runtime, Capacity, SafetensorsTensors, KernError
    tensors = SafetensorsTensors.open("models/qwen3-tiny-en")
    with Runtime.load("manifests/qwen3-tiny-en.json", "kernels", tensors, gpu=0,
                      capacity=Capacity(tokens=4096, seqs=1)) as rt:
        lease = rt.lease(1)                                      # pages for one token
        rt.write_input("token_ids", np.array([42], np.int32))    # the prompt's one token
        rt.write_input("positions", np.array([0], np.int32))
        rt.write_input("seq_lens", np.array([1], np.int32))
        rt.write_input("slot_mapping", lease.slots(0, 1))
        rt.write_input("block_table", rt.block_table([lease], width=128))
        rt.issue("decode", {"tokens": 1, "seqs": 1})             # every var the program reads
        packed = rt.read_output("next_token", 1)                 # synchronises; i64 [seqs], 1 row here
        token = int(packed[0]) & 0xFFFFFFFF                      # the token id (meta.caller.sampling "packed")

(from the repository root: the tiny checkpoint and its manifest are committed; tests/runtime/
test_docstring_example_cpu.py runs this block against the fake driver.)

`import kern_runtime` does not load CUDA: the driver, cuBLASLt and NCCL are imported on first use.
"""

from .kv.capacity import Capacity, PoolLayout, plan_pool
from .errors import (
    KERN_ERRORS, ApiError, BlasError, CallError, CoResidencyError, CudaError, DeviceFaultError, DriverError,
    KernelArtifactError, KernError, ManifestError, ManifestParseError, ManifestVerifyError, PinSearchError,
    WeightArtifactError,
)
from .program.params import ParamBlock, encode_pointer, encode_scalar
from .kv.handles import DeviceCheckpoint, DeviceLease, DeviceWaking
from .multigpu.connect import LocalGroup, connect_local
from .multigpu.peers import Offer, PeerHandle
from .runtime import ResidentWeights, Runtime, load_spec
from .buffer_io import EventHandle, ReadbackHandle
from .weights.loader import STAGING_BYTES
from .weights import (
    BindPlan, Blob, Copy, DeviceBlob, FileBlob, HostBlob, HostTensors, SafetensorsTensors, TensorMeta, Tensors,
    index_shards, parse_safetensors_header, plan_bind, read_safetensors_header,
)

__version__ = "0.1.0"  # the one source of the version: [tool.hatch.version] reads it, the kern pins must equal it
__all__ = [
    "__version__",
    "KERN_ERRORS", "ApiError", "BindPlan", "BlasError", "Blob", "CallError", "Capacity", "CoResidencyError", "Copy",
    "CudaError", "DeviceBlob", "DeviceFaultError", "DriverError", "EventHandle", "FileBlob", "HostBlob", "HostTensors",
    "KernError", "KernelArtifactError", "ManifestError", "ManifestParseError", "ManifestVerifyError", "ParamBlock",
    "PinSearchError", "PoolLayout", "ReadbackHandle",
    "ResidentWeights", "Runtime", "SafetensorsTensors", "TensorMeta", "Tensors", "WeightArtifactError",
    "encode_pointer", "encode_scalar", "load_spec", "plan_bind", "plan_pool",
    "DeviceCheckpoint", "DeviceLease", "DeviceWaking", "LocalGroup", "Offer", "PeerHandle", "connect_local", "index_shards",
    "parse_safetensors_header", "read_safetensors_header", "STAGING_BYTES",
]
