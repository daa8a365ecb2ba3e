"""Whole-state access on a GPU: `write_state_at` bytes reach kernels, kernel writes come back through
`read_state`, `zero_states` zeroes exactly the named states, and a remap ends whole-state access to the
pooled states (spec runtime.md: valid only before the first remap).

Manifest (written here; `kern_scale` from tests/runtime/kernels/toy.cubin, y[i] = 2 x[i] + 1): a fixed state
`fx` (2048 bytes), a paged state `kv` (256 KiB per token, 16-token pages = 4 MiB) and a per-seq state `rec`
(4 MiB per slot), so the pool's blocks are 2 MiB. Capacity(tokens=128, seqs=2): pages 0..8, slots 0..3; a
fifth slot takes the blocks of the highest free page (a remap touching both pooled states).

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/runtime/test_state_access_gpu.py -q
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import KERNELS_DIR

from kern_runtime import ApiError, Capacity, Runtime

pytestmark = pytest.mark.gpu

FIXED = 2048
BPT = 256 * 1024
BPS = 4 * 1024 * 1024
SCALE = {
    "args": [{"name": "x", "kind": "ptr"}, {"name": "y", "kind": "ptr"}, {"name": "n", "kind": "int"}],
    "launches": [{"module": "toy", "entry": "kern_scale", "grid": ["cdiv(tokens * 4, 128)", 1, 1], "block": [128, 1, 1],
                  "params": [[0, 8], [8, 8], [16, 4], [20, 4]],
                  "args": [{"arg": "x"}, {"arg": "y"}, {"arg": "n", "type": "i32"}, {"f32": 2.0}]}],
}


def kernels_dir(tmp_path: Path) -> tuple[Path, str]:
    """toy.cubin copied as `toy-<sha12>.cubin`; (dir, pin)."""
    out = tmp_path / "kernels"
    out.mkdir()
    data = (KERNELS_DIR / "toy.cubin").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    shutil.copyfile(KERNELS_DIR / "toy.cubin", out / f"toy-{digest[:12]}.cubin")
    return out, digest


def manifest(pin: str) -> dict:
    scale = lambda x, y: {"calls": [{"op": "scale", "args": {"x": x, "y": y, "n": "tokens * 4"}}]}  # noqa: E731
    return {
        "format": "kern-manifest/1", "name": "state-access",
        "vars": {"tokens": {"min": 1, "max": 64}},
        "modules": {"toy": pin},
        "buffers": {"x": {"kind": "input", "dtype": "f32", "shape": ["tokens", 4]},
                    "y": {"kind": "output", "dtype": "f32", "shape": ["tokens", 4]}},
        "states": {"fx": {"kind": "fixed", "bytes": FIXED},
                   "kv": {"kind": "paged", "bytes_per_token": BPT, "page_tokens": 16},
                   "rec": {"kind": "per_seq", "bytes_per_seq": BPS}},
        "ops": {"scale": SCALE},
        "programs": {"kv_to_y": scale("kv", "y"), "fx_to_y": scale({"state": "fx", "offset": 512}, "y"),
                     "x_to_rec": scale("x", "rec")},
    }


def test_whole_state_round_trip_through_kernels_and_refusal_after_remap(tmp_path: Path) -> None:
    kdir, pin = kernels_dir(tmp_path)
    with Runtime.load(manifest(pin), kdir, None, capacity=Capacity(tokens=128, seqs=2)) as rt:
        assert rt.pool is not None and rt.num_pages == 9 and rt.num_slots == 4
        size = {"fx": FIXED, "kv": rt.pool.mapped_bytes["kv"], "rec": rt.pool.mapped_bytes["rec"]}
        assert size["kv"] == 9 * 16 * BPT and size["rec"] == 4 * BPS  # 2 MiB blocks: whole objects
        for name, n in size.items():
            got = rt.read_state(name)
            assert got.dtype == np.uint8 and got.shape == (n,) and not got.any(), name

        # host -> state -> kernel: the kernels see the bytes at the offsets written
        a = np.arange(8, dtype=np.float32) - 3.5
        rt.write_state_at("kv", 0, a)
        rt.write_state_at("fx", 512, 2 * a)
        rt.run("kv_to_y", {"tokens": 2})
        np.testing.assert_array_equal(rt.read_output("y", rows=2).reshape(-1), 2 * a + 1)
        rt.run("fx_to_y", {"tokens": 2})
        np.testing.assert_array_equal(rt.read_output("y", rows=2).reshape(-1), 4 * a + 1)

        # kernel -> state -> host: read_state waits for the launch queued before it
        x = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.25
        rt.write_input("x", x)
        rt.run("x_to_rec", {"tokens": 3})
        rec = rt.read_state("rec")
        np.testing.assert_array_equal(rec[:48].view(np.float32), (2 * x + 1).reshape(-1))
        assert not rec[48:].any()
        kv, fx = rt.read_state("kv"), rt.read_state("fx")
        np.testing.assert_array_equal(kv[:32].view(np.float32), a)
        assert not kv[32:].any()
        np.testing.assert_array_equal(fx[512:544].view(np.float32), 2 * a)
        assert not fx[:512].any() and not fx[544:].any()

        # zero exactly the named states (on the stream: the next launch sees zeros)
        rt.zero_states(["rec"])
        assert not rt.read_state("rec").any()
        np.testing.assert_array_equal(rt.read_state("kv"), kv)
        np.testing.assert_array_equal(rt.read_state("fx"), fx)
        rt.zero_states(["kv", "fx"])
        rt.run("kv_to_y", {"tokens": 2})
        np.testing.assert_array_equal(rt.read_output("y", rows=2), np.ones((2, 4), np.float32))
        assert all(not rt.read_state(n).any() for n in size)

        # a remap (slot 4 from the blocks of page 8) ends whole-state access to both pooled states
        held = [rt.lease_slot() for _ in range(3)]
        held.append(rt.lease_slot())  # waits for the remap to land
        assert held[-1].seq_slot_id == 4
        for name in ("kv", "rec"):
            with pytest.raises(ApiError, match=rf"state '{name}' .* was remapped \(remap plan 1\)"):
                rt.read_state(name)
            with pytest.raises(ApiError, match="valid only before the first remap"):
                rt.write_state_at(name, 0, b"\x01")
            with pytest.raises(ApiError, match="was remapped"):
                rt.zero_states([name])
        rt.write_state_at("fx", FIXED - 4, np.array([7], np.int32))  # fixed states are never remapped
        assert rt.read_state("fx")[-4:].view(np.int32).tolist() == [7]
        for lease in held:
            lease.close()
