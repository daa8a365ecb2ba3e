"""Parity of the decode-v2 wiring (manifests/qwen3-tiny-v2.json: `gen_qwen3.py --gemv v2`, rows-family GEMVs,
the SwiGLU epilogue on gate_up, kern_attn_decode_partial_fast) on the seeded `tiny` checkpoint: against
transformers as tests/parity/test_parity_gpu.py checks v1 (teacher-forced decode from position 0 and after
a chunked prefill), graph == eager bit for bit, and against the v1 manifest's logits (same bound).
Run with `KERN_REQUIRE_GPU=1 pytest tests/parity/test_parity_v2_gpu.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from test_parity_gpu import REL_TOL, _check, _ids, _open, _reference, ckpt, closing_fixture  # noqa: E402,F401  (ckpt: the shared fixture)


def test_v2_logits_match_v1(ckpt: Path) -> None:
    """Same weights, decode logits of v1 and v2 within the parity tolerance of each other. First in the file
    and before gen_v2 exists: the two generators are opened one after the other, never both at once."""
    ids = _ids(60, seed=7)
    logits = {}
    for name in ("qwen3-tiny.json", "qwen3-tiny-v2.json"):
        g = _open(ckpt, name)
        try:
            logits[name] = np.asarray(g.teacher_forced(ids, 20, 512)[0], dtype=np.float64)
        finally:
            g.close()
    v1, v2 = logits["qwen3-tiny.json"], logits["qwen3-tiny-v2.json"]
    assert v1.shape == v2.shape and np.isfinite(v2).all()
    rel = np.linalg.norm(v2 - v1, axis=-1) / np.maximum(np.linalg.norm(v1, axis=-1), 1e-30)
    assert rel.max() < REL_TOL, f"v2 vs v1 logits: max relative error per row {rel.max():.3e}"


gen_v2 = closing_fixture("gen_v2", lambda ckpt_dir: _open(ckpt_dir, "qwen3-tiny-v2.json"))
ref_v2 = closing_fixture("ref_v2", _reference, after="gen_v2")


def test_v2_decode_teacher_forced_from_position_0(gen_v2, ref_v2) -> None:
    from kern_run.compare import teacher_forced_vs

    ids = _ids(80, seed=1)
    cmp, argmax = teacher_forced_vs(gen_v2, ref_v2, ids, prefill_tokens=0, chunk=512)
    _check(cmp, argmax, [s.top1_a for s in cmp.steps], "v2 decode from 0")


def test_v2_chunked_prefill_then_decode(gen_v2, ref_v2) -> None:
    from kern_run.compare import teacher_forced_vs

    ids = _ids(200 + 40, seed=2)
    cmp, argmax = teacher_forced_vs(gen_v2, ref_v2, ids, prefill_tokens=200, chunk=512)
    _check(cmp, argmax, [s.top1_a for s in cmp.steps], "v2 prefill 200 then decode")


def test_v2_graph_and_eager_logits_bitwise_equal(gen_v2) -> None:
    ids = _ids(60, seed=5)
    graph, _ = gen_v2.teacher_forced(ids, 40, 512)
    eager, _ = gen_v2.teacher_forced(ids, 40, 512, eager=True)
    np.testing.assert_array_equal(graph, eager)
