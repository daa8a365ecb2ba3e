"""`Runtime.load`'s arguments, checked before anything is allocated (`check_load_args`), and the intake of the
manifest itself (`load_spec`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from kern_manifest import Manifest
from kern_pool import sizing

from .errors import ApiError, ManifestParseError, ManifestVerifyError, int_arg
from .weights.resident import ResidentWeights
from .weights.tensors import Tensors


def load_spec(manifest: Any) -> Manifest:
    """Parse + verify a manifest given as a path, JSON text, a JSON dict or a kern_manifest.Manifest, and
    return the kern_manifest.Manifest (the runtime's only model of it). A Manifest that kern_manifest.verify
    (or load_manifest) has already accepted is returned as it is, neither parsed nor verified again: so
    `kern run` parses and verifies once and hands the object to `Runtime.load`.

    Raises ManifestParseError / ManifestVerifyError (subclasses of kern_manifest's) for bad input.
    """
    import kern_manifest

    try:
        if isinstance(manifest, kern_manifest.Manifest):
            parsed = manifest
        elif isinstance(manifest, (str, os.PathLike)) and not str(manifest).lstrip().startswith("{"):
            try:
                text = kern_manifest.read_manifest_bytes(manifest)  # a regular file of at most 64 MiB
            except OSError as exc:
                raise kern_manifest.ManifestParseError(
                    "$", f"cannot read manifest {os.fspath(manifest)!r}: {exc.strerror or exc}") from None
            parsed = kern_manifest.parse_manifest(text)
        else:
            parsed = kern_manifest.parse_manifest(manifest)
        kern_manifest.verify(parsed)
    except kern_manifest.ManifestParseError as exc:
        raise ManifestParseError(exc.path, exc.message) from exc
    except kern_manifest.ManifestVerifyError as exc:
        raise ManifestVerifyError(exc.faults) from exc
    return parsed


def check_load_args(kernels_dir: Any, tensors: Any, gpu: Any, capacity: Any, progress: Any, ranks: Any,
                     resident: Any, threads: Any) -> tuple[int, dict[str, int], dict[str, int], int | None]:
    """`Runtime.load`'s arguments checked before anything is allocated: (gpu, ranks as {group: index},
    the group sizes `ranks` gave as {group: size}, threads) as ints. Raises ApiError naming the argument;
    the sizes are checked against the manifest's topology later (`_check_topology`)."""
    if not isinstance(kernels_dir, (str, os.PathLike)):
        raise ApiError(f"kernels_dir must be a directory path (str or os.PathLike), got {type(kernels_dir).__name__}")
    if tensors is not None and not isinstance(tensors, Tensors):
        raise ApiError(f"tensors must be a Tensors (SafetensorsTensors, HostTensors, ...) or None, "
                       f"got {type(tensors).__name__}")
    gpu = int_arg(gpu, "gpu")
    if not isinstance(capacity, sizing.Capacity):  # kern_runtime.Capacity, or kern_pool's own (the same rules)
        raise ApiError(f"capacity must be a Capacity(tokens=..., seqs=...), got {type(capacity).__name__}")
    if progress is not None and not callable(progress):
        raise ApiError(f"progress must be callable(bytes_done, bytes_total) or None, got {type(progress).__name__}")
    if ranks is None:
        ranks = {}
    if not isinstance(ranks, Mapping):
        raise ApiError(f"ranks must be a mapping of topology group -> index or (index, size), "
                       f"got {type(ranks).__name__}")
    checked: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for group, rank in ranks.items():
        if not isinstance(group, str):
            raise ApiError(f"ranks: group names are strings, got {group!r}")
        if isinstance(rank, (tuple, list)):  # (index, size): the topology's entry for this group
            if len(rank) != 2:
                raise ApiError(f"ranks[{group!r}] must be an index or an (index, size) pair, got {rank!r}")
            checked[group] = int_arg(rank[0], f"ranks[{group!r}] index")
            sizes[group] = int_arg(rank[1], f"ranks[{group!r}] size")
        else:
            checked[group] = int_arg(rank, f"ranks[{group!r}]")
    if resident is not None:
        if not isinstance(resident, ResidentWeights):
            raise ApiError(f"resident must be a ResidentWeights (from into_resident()), got {type(resident).__name__}")
        if resident.gpu != gpu:
            raise ApiError(f"resident weights live on GPU {resident.gpu}, not {gpu}")
    if threads is not None:
        threads = int_arg(threads, "threads", 1)
    return gpu, checked, sizes, threads
