"""kern test's sampled prompts stay inside the checkpoint's vocabulary (a 151643-id prompt on the
8192-token default model tripped a device-side assert in transformers on the H200)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kern_run.abtest import PROMPTS, sample_prompts
from kern_run.text import TextCodec

ROOT = Path(__file__).resolve().parents[2]


def test_random_prompt_ids_below_base_vocab() -> None:
    codec = TextCodec(Tokenizer.from_file(str(ROOT / "models" / "qwen3-tiny-en" / "tokenizer.json")), frozenset({0}))
    prompts = sample_prompts(codec, len(PROMPTS) + 3, seed=0, random_tokens=300, max_tokens=1000)
    assert len(prompts) == len(PROMPTS) + 3
    randoms = prompts[len(PROMPTS):]
    assert [len(p) for p in randoms] == [300, 600, 900]
    assert max(max(p) for p in randoms) < 8192 and min(min(p) for p in randoms) >= 0
    assert max(max(p) for p in randoms) > 8000  # the whole range is used, not a small corner


# ---- request checks: refused before anything loads


@pytest.mark.parametrize("req, match", [
    (dict(prompts=0), "--prompts 0: need at least 1"),
    (dict(prompts=-3), "--prompts -3"),
    (dict(steps=-1), "--steps -1"),
    (dict(margin_tol=-1.0), "--margin-tol -1.0"),
    (dict(against="egaer"), "'egaer': not one of eager, chunk1, transformers and not a manifest file"),
])
def test_bad_requests_are_refused_before_loading(tmp_path, req, match) -> None:
    from kern_run.abtest import AbRequest, check_request
    from kern_run.config import RunConfig
    from kern_run.errors import InputError

    cfg = RunConfig(tmp_path / "a.json", tmp_path / "k", tmp_path / "w")
    with pytest.raises(InputError, match=match):
        check_request(AbRequest(**req), cfg)


def test_transformers_mode_needs_torch_and_transformers(tmp_path, monkeypatch) -> None:
    import importlib.util

    from kern_run.abtest import AbRequest, check_request
    from kern_run.config import RunConfig
    from kern_run.errors import RefusalError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else (object() if name == "torch" else real(name, *a)))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.safetensors").write_bytes(b"")  # a weights path that exists (checked first)
    cfg = RunConfig(tmp_path / "a.json", tmp_path / "k", tmp_path / "w")
    with pytest.raises(RefusalError, match="needs transformers"):
        check_request(AbRequest(against="transformers"), cfg)


def test_manifest_b_gets_its_own_config(tmp_path) -> None:
    from kern_run.abtest import AbRequest, check_request
    from kern_run.config import RunConfig

    b = tmp_path / "b.json"
    b.write_text("{}")
    cfg = RunConfig(tmp_path / "a.json", tmp_path / "k", tmp_path / "w", chunk=64)
    got = check_request(AbRequest(against=str(b)), cfg)
    assert got is not None and got.manifest == b and got.chunk is None and got.weights == cfg.weights
    assert check_request(AbRequest(against="eager"), cfg) is None
