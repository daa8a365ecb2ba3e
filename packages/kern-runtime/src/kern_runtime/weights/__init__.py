"""Weights: where tensors come from (`Tensors`), how binds become copies (`plan_bind`), and the loader."""

from .plan import BindPlan, Copy, plan_bind
from .safetensors import SafetensorsTensors, index_shards, parse_safetensors_header, read_safetensors_header
from .tensors import Blob, DeviceBlob, FileBlob, HostBlob, HostTensors, TensorMeta, Tensors

__all__ = [
    "BindPlan", "Blob", "Copy", "DeviceBlob", "FileBlob", "HostBlob", "HostTensors", "SafetensorsTensors",
    "TensorMeta", "Tensors", "index_shards", "parse_safetensors_header", "plan_bind", "read_safetensors_header",
]
