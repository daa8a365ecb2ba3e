"""kern-runtime: kern's executor.

    from kern_runtime import Runtime, Capacity, SafetensorsTensors, KernError
    tensors = SafetensorsTensors.open("weights/Qwen3-4B")
    with Runtime.load("manifests/qwen3-4b.json", "kernels", tensors, gpu=0,
                      capacity=Capacity(tokens=4096, seqs=1)) as rt:
        rt.write_input("token_ids", ids)
        rt.issue("decode", {"tokens": 1})
        token = rt.read_output("next_token")

`import kern_runtime` does not load CUDA: the driver, cuBLASLt and NCCL are imported on first use.
"""

from .kv.capacity import Capacity, PoolLayout, plan_pool
from .errors import (
    KERN_ERRORS, ApiError, BlasError, CallError, CudaError, DriverError, KernelArtifactError, KernError,
    ManifestError, ManifestParseError, ManifestVerifyError, WeightArtifactError,
)
from .program.params import ParamBlock, encode_pointer, encode_scalar
from .kv.pooled import Checkpoint, Lease, Waking
from .runtime import ReadbackHandle, Resident, Runtime, load_spec
from .program.stepping import EventHandle
from .weights import (
    BindPlan, Blob, Copy, DeviceBlob, FileBlob, HostBlob, HostTensors, SafetensorsTensors, TensorMeta, Tensors,
    plan_bind,
)

__all__ = [
    "KERN_ERRORS", "ApiError", "BindPlan", "BlasError", "Blob", "CallError", "Capacity", "Copy", "CudaError",
    "DeviceBlob", "DriverError", "EventHandle", "FileBlob", "HostBlob", "HostTensors", "KernError", "KernelArtifactError",
    "ManifestError", "ManifestParseError", "ManifestVerifyError", "ParamBlock", "PoolLayout", "ReadbackHandle",
    "Resident", "Runtime", "SafetensorsTensors", "TensorMeta", "Tensors", "WeightArtifactError",
    "encode_pointer", "encode_scalar", "load_spec", "plan_bind", "plan_pool",
    "Checkpoint", "Lease", "Waking",
]
