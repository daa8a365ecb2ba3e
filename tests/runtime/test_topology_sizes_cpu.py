"""`Runtime.load(..., ranks=...)` over the fake driver (fake_cuda.py): `{group: index}` as before, and the
spec's topology form `{group: (index, size)}` whose size must equal the manifest's group size
(runtime.md: "给出本 rank 在每个组的下标（大小必须与 manifest 一致）"). Argument errors come before
anything is allocated; a size mismatch is refused at the topology check, before the context is opened."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeDriver, fake_cuda  # noqa: F401 - the fixture
from runtime_helpers import base_manifest, scale_op

from kern_runtime import ApiError, Runtime

LAYOUT = ((0, 8), (8, 8), (16, 4), (20, 4))
PAYLOAD = b"\x7fELF fake toy for topology"


def topo_manifest(tp: int = 2, dp: int = 3) -> dict:
    """One kernel call whose last parameter is this rank's index in group `tp`; groups tp and dp."""
    op = scale_op(entry="k_rank")
    op["launches"][0]["args"][3] = {"rank": "tp", "type": "i32"}
    m = base_manifest(ops={"rank": op},
                      programs={"step": {"calls": [{"op": "rank", "args": {"x": "x", "y": "y", "n": "tokens"}}]}},
                      topology={"tp": {"size": tp}, "dp": {"size": dp}})
    m["modules"] = {"toy": hashlib.sha256(PAYLOAD).hexdigest()}
    return m


@pytest.fixture
def kernels(fake_cuda: FakeDriver, tmp_path: Path) -> Path:
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    (tmp_path / f"toy-{digest[:12]}.cubin").write_bytes(PAYLOAD)
    fake_cuda.entries = {"k_rank": LAYOUT}
    return tmp_path


def burned_rank(rt: Runtime) -> int:
    (rec,) = rt.records("step")
    return struct.unpack("<i", rec.params.read(3)[:4])[0]


@pytest.mark.parametrize("ranks, tp, dp", [
    ({"tp": 1}, 1, None),                                   # the old form still works
    ({"tp": (1, 2)}, 1, None),                              # (index, size)
    ({"tp": [0, 2], "dp": (2, 3)}, 0, 2),                   # a list pair too
    ({"tp": (np.int64(1), np.int32(2)), "dp": 0}, 1, 0),   # numpy integers, forms mixed
])
def test_ranks_index_or_index_and_size(kernels: Path, ranks: dict, tp: int, dp: int | None) -> None:
    with Runtime.load(topo_manifest(), kernels, None, ranks=ranks) as rt:
        expected = {"tp": tp} if dp is None else {"tp": tp, "dp": dp}
        assert rt.ranks == expected and all(type(v) is int for v in rt.ranks.values())
        assert burned_rank(rt) == tp


@pytest.mark.parametrize("ranks, message", [
    ({"tp": (0, 3)}, r"ranks\['tp'\] gives group 'tp' size 3; the manifest's topology has size 2"),
    ({"tp": (1, 1)}, r"group 'tp' size 1; the manifest's topology has size 2"),
    ({"tp": 0, "dp": (0, 2)}, r"ranks\['dp'\] gives group 'dp' size 2; the manifest's topology has size 3"),
    ({"tp": (5, 4)}, r"gives group 'tp' size 4; .* size 2"),  # the size is named before the index range
])
def test_size_mismatch_refused_before_the_device_is_touched(kernels: Path, fake_cuda: FakeDriver, ranks: dict,
                                                            message: str) -> None:
    with pytest.raises(ApiError, match=message):
        Runtime.load(topo_manifest(), kernels, None, ranks=ranks)
    assert fake_cuda.calls == []


@pytest.mark.parametrize("ranks, message", [
    ({"tp": (0,)}, r"ranks\['tp'\] must be an index or an \(index, size\) pair, got \(0,\)"),
    ({"tp": (0, 2, 1)}, r"must be an index or an \(index, size\) pair"),
    ({"tp": []}, r"must be an index or an \(index, size\) pair"),
    ({"tp": (True, 2)}, r"ranks\['tp'\] index must be an integer, got True"),
    ({"tp": (0, 2.0)}, r"ranks\['tp'\] size must be an integer, got 2.0"),
    ({"tp": (0, "2")}, r"ranks\['tp'\] size must be an integer"),
    ({"tp": (0, None)}, r"ranks\['tp'\] size must be an integer"),
    ({"tp": "0"}, r"ranks\['tp'\] must be an integer"),
    ({"tp": {"index": 0, "size": 2}}, r"ranks\['tp'\] must be an integer"),
    ([("tp", 0)], r"ranks must be a mapping of topology group -> index or \(index, size\)"),
])
def test_malformed_ranks_refused_before_anything(kernels: Path, fake_cuda: FakeDriver, ranks, message: str) -> None:
    with pytest.raises(ApiError, match=message):
        Runtime.load(topo_manifest(), kernels, None, ranks=ranks)
    assert fake_cuda.calls == []


@pytest.mark.parametrize("ranks, message", [
    ({"tp": (2, 2)}, r"rank 2 is outside group 'tp' of size 2"),
    ({"tp": (-1, 2)}, r"rank -1 is outside group 'tp' of size 2"),
    ({"tp": 2}, r"rank 2 is outside group 'tp' of size 2"),
    ({"pp": (0, 1)}, r"ranks names group 'pp'; the manifest's topology has \['dp', 'tp'\]"),
])
def test_index_range_and_unknown_group_still_refused(kernels: Path, fake_cuda: FakeDriver, ranks: dict,
                                                     message: str) -> None:
    with pytest.raises(ApiError, match=message):
        Runtime.load(topo_manifest(), kernels, None, ranks=ranks)
    assert fake_cuda.calls == []


def test_size_given_for_a_manifest_without_topology_is_refused(fake_cuda: FakeDriver, tmp_path: Path) -> None:
    with pytest.raises(ApiError, match=r"ranks names group 'tp'; the manifest's topology has \[\]"):
        Runtime.load(base_manifest(), tmp_path, None, ranks={"tp": (0, 1)})
    assert fake_cuda.calls == []


@pytest.mark.parametrize("ranks", [{"tp": (0, 3)}, {"tp": 2}, {"pp": 0}])
def test_ranks_refusal_leaves_the_resident_as_it_was(kernels: Path, fake_cuda: FakeDriver, ranks: dict) -> None:
    """A ranks refusal is an argument error: like a resident of another GPU, it leaves `resident` usable (the
    load docstring: "Argument errors are raised before anything is allocated (`resident` is then left as it
    was)"); it used to be raised inside the load's cleanup, which closed the resident."""
    from kern_runtime import HostTensors

    m = topo_manifest()
    m["buffers"]["w"] = {"kind": "weight", "dtype": "bf16", "shape": [8, 16], "bind": [{"tensor": "q"}]}
    tensors = HostTensors({"q": ("bf16", np.arange(128, dtype=np.uint16).reshape(8, 16))})
    res = Runtime.load(m, kernels, tensors, ranks={"tp": 0}).into_resident()
    kept, context = dict(res.buffers), res.context
    assert len(kept) == 1
    before = len(fake_cuda.calls)
    with pytest.raises(ApiError, match="ranks names group|size 3|outside group"):
        Runtime.load(m, kernels, tensors, ranks=ranks, resident=res)
    assert fake_cuda.calls[before:] == []  # nothing touched, nothing freed
    assert res.buffers == kept and res.context is context
    with Runtime.load(m, kernels, tensors, ranks={"tp": 1}, resident=res) as rt:
        assert burned_rank(rt) == 1
        assert rt.address_of("w") == next(iter(kept.values())).address  # claimed, not reloaded
