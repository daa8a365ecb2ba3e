"""Helpers for kern-run's CPU tests (imported by conftest.py and the tests; a unique module name)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kern_run.models import qwen3
from tools import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def kern_manifest_build(argv: list[str]) -> int:
    """`kern manifest build ARGV` in-process (its output to the test's capsys); the exit status."""
    from kern_run.cli import app

    try:
        app(["manifest", "build", *argv], prog_name="kern")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def byte_tokenizer(path: Path, eos_token: str = "<|endoftext|>") -> Path:
    """A byte-level BPE tokenizer.json with no merges (one token per byte) plus one special token.

    Ids 0..255 are the bytes in GPT-2's byte-to-unicode order; `eos_token` is id 256.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_map = make_checkpoint_byte_map()
    vocab = {ch: i for i, ch in enumerate(byte_map)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eos_token])
    tok.save(str(path))
    return path


def make_checkpoint_byte_map() -> list[str]:
    from tools.qwen_tokenizer_json import bytes_to_unicode

    m = bytes_to_unicode()
    return [m[b] for b in range(256)]


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` checkpoint (seed 0) with the byte-level test tokenizer and eos id 256."""
    out = tmp_path_factory.mktemp("ckpt") / "qwen3-tiny"
    make_checkpoint.write_checkpoint(out, make_checkpoint.SHAPES["tiny"], seed=0, with_tokenizer=False,
                                     log=lambda *_: None)
    byte_tokenizer(out / "tokenizer.json")
    gen = json.loads((out / "generation_config.json").read_text())
    gen["eos_token_id"] = [256]
    (out / "generation_config.json").write_text(json.dumps(gen))
    cfg = json.loads((out / "config.json").read_text())
    cfg["eos_token_id"] = 256
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def stub_kernels(dir_: Path) -> Path:
    """A kernels dir whose cubins are fake bytes and whose kernels.json pins their real sha256."""
    raw = qwen3.stub_kernels_json()
    dir_.mkdir(parents=True, exist_ok=True)
    for name, mod in raw["modules"].items():
        content = f"fake cubin {name}".encode()
        mod["sha256"] = hashlib.sha256(content).hexdigest()
        mod["file"] = f"{name}-{mod['sha256'][:12]}.cubin"
        (dir_ / mod["file"]).write_bytes(content)
    (dir_ / "kernels.json").write_text(json.dumps(raw, indent=1, sort_keys=True))
    return dir_


@pytest.fixture(scope="session")
def kernels_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stub_kernels(tmp_path_factory.mktemp("kernels"))


def make_manifest(path: Path, kernels: Path, shape: str = "tiny", untied: bool = False, chunk_max: int = 64,
                  max_context: int = 1024) -> Path:
    cfg_json = make_checkpoint.config_json(make_checkpoint.SHAPES[shape])
    cfg_json["tie_word_embeddings"] = not untied
    cfg = qwen3.Qwen3Config.from_json(cfg_json)
    abi = qwen3.read_kernel_abi(kernels)
    manifest = qwen3.build_manifest(cfg, abi, qwen3.BuildOptions(shape, chunk_max, max_context))
    path.write_text(qwen3.dumps(manifest))
    return path


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory: pytest.TempPathFactory, kernels_dir: Path) -> Path:
    return make_manifest(tmp_path_factory.mktemp("manifest") / "qwen3-tiny.json", kernels_dir)


class FakeRuntime:
    """Records the caller's calls; its "model" predicts next = (token * 7 + position + 1) % 250 + 3.

    Prefill fills a fake KV cache (position -> token) so decode can check the caller prefilled every
    earlier position before it; logits are one-hot-ish at the predicted id.
    """

    def __init__(self, page_tokens: int = 16, num_pages: int = 64, vocab: int = 300) -> None:
        from kern_pool import Layout, Pool

        self.page_tokens = page_tokens
        self.num_pages = num_pages
        self.kern_pool = Pool(Layout.simple(page_tokens, pages=num_pages - 1))  # page 0: the scratch page
        self.vocab = vocab
        self.inputs: dict[str, np.ndarray] = {}
        self.calls: list[tuple[str, dict[str, int], bool]] = []
        self.scratch_calls: list[tuple[str, dict[str, int], bool]] = []  # warm-up calls on the scratch page
        self.kv: dict[int, int] = {}
        self.next_token = np.zeros(1, np.int64)
        self.logits = np.zeros((1, vocab), np.float32)
        self.closed = False
        self.weight_load_stats = (1000, 0.001)

    def write_input(self, name: str, array: np.ndarray) -> None:
        want = np.uint32 if name == "sample_params" else np.int32  # the sampler's params: u32 words
        assert array.dtype == want, (name, array.dtype)
        self.inputs[name] = np.array(array)

    @staticmethod
    def predict(token: int, position: int) -> int:
        return (token * 7 + position + 1) % 250 + 3

    def scratch_only(self, values: dict[str, int]) -> bool:
        """Whether this call touches only the scratch page 0 (a warm-up at load: block-table row and slots all in
        page 0); such a call is recorded in `scratch_calls`, not `calls`, and reads or writes no KV."""
        n = values["tokens"]
        pages = self.inputs.get("block_table")
        if pages is None or pages[0].any():
            return False
        assert (self.inputs["slot_mapping"][:n] < self.page_tokens).all(), "a scratch call writes page 0 only"
        return True

    def issue(self, program: str, values: dict[str, int], eager: bool = False) -> None:
        n = values["tokens"]
        if self.scratch_only(values):
            self.scratch_calls.append((program, dict(values), eager))
            self.next_token[0] = 0
            return
        self.calls.append((program, dict(values), eager))
        ids, pos, slots = (self.inputs[k][:n] for k in ("token_ids", "positions", "slot_mapping"))
        pages = self.inputs["block_table"][0]
        want = [pages[p // self.page_tokens] * self.page_tokens + p % self.page_tokens for p in pos]
        assert list(slots) == want, "slot = page_ids[p // page_tokens] * page_tokens + p % page_tokens"
        assert 0 not in pages[:(int(pos[-1]) // self.page_tokens) + 1], "page 0 is the runtime's scratch page"
        assert int(self.inputs["seq_lens"][0]) == int(pos[-1]) + 1
        for t, p in zip(ids, pos):
            self.kv[int(p)] = int(t)
        if program == "prefill":
            assert list(self.inputs["cu_seqlens_q"][:2]) == [0, n]
        else:
            assert n == 1
            p = int(pos[0])
            assert all(q in self.kv for q in range(p)), f"decode at {p} before positions {set(range(p)) - set(self.kv)}"
            nxt = self.predict(int(ids[0]), p)
            self.next_token[0] = nxt
            self.logits[:] = 0
            self.logits[0, nxt] = 1.0

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        assert name == "next_token" and rows in (None, 1)
        return self.next_token.copy()

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        assert name == "logits" and rows in (None, 1)
        return self.logits.copy() if rows is None else self.logits[:rows].copy()

    def lease(self, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        return self.kern_pool.lease(num_tokens)

    def describe(self) -> dict:
        return {"graphs": {"decode": 1}}

    def into_resident(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "FakeRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def patch_generator_open(monkeypatch: pytest.MonkeyPatch, runtime_class: type) -> list:
    """Make `Generator.open` build `runtime_class(num_pages=capacity_tokens // 16)` instead of loading anything;
    returns the runtimes made, in order (empty: nothing was loaded)."""
    from kern_run.generate import Generator

    made: list = []

    def open_fake(manifest, kernels, weights, facts, gpu=0, capacity_tokens=4096, eos_ids=frozenset(), progress=None,
                  resident=None):
        rt = runtime_class(num_pages=capacity_tokens // 16)
        made.append(rt)
        return Generator(rt, facts, eos_ids)

    monkeypatch.setattr(Generator, "open", staticmethod(open_fake))
    return made


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> list[FakeRuntime]:
    """`Generator.open` builds a FakeRuntime (pages for the requested capacity) instead of loading anything; the
    runtimes made, in order (empty: nothing was loaded)."""
    return patch_generator_open(monkeypatch, FakeRuntime)


PROBED = "stub device probe reached"  # what stub_device_probe's refusal says (exit 3, as no device would)


def _empty_kern_toml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """KERN_TOML names an empty file: no repository target."""
    empty = tmp_path / "empty-kern.toml"
    empty.write_text("")
    monkeypatch.setenv("KERN_TOML", str(empty))


@pytest.fixture
def with_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty kern.toml and a device probe that finds one GPU."""
    import kern_run.session as session

    _empty_kern_toml(monkeypatch, tmp_path)
    monkeypatch.setattr(session, "probe_device", lambda gpu: 1)


@pytest.fixture
def stub_device_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty kern.toml (no repository target) and a device probe, on both the single-GPU and the --tp path,
    that refuses with exit 3 and PROBED: a refusal of the inputs (exit 2) must come before it."""
    import kern_run.session as session
    import kern_run.tp as tp
    import kern_run.tp_procs as tp_procs
    from kern_run.errors import NoDeviceError

    _empty_kern_toml(monkeypatch, tmp_path)

    def probe(gpu: int) -> int:
        raise NoDeviceError(f"{PROBED} (gpu {gpu})")

    monkeypatch.setattr(session, "probe_device", probe)
    monkeypatch.setattr(tp, "probe_device", probe)
    monkeypatch.setattr(tp_procs, "probe_device", probe)  # `kern run --tp N`'s parent, before the rank processes


def refused_line(args: list[str], *needles: str, code: int = 2) -> str:
    """`kern ARGS` through typer's runner: exit `code`, exactly one stderr line holding every needle, no traceback,
    nothing on stdout. Returns the line."""
    from typer.testing import CliRunner

    from kern_run.cli import app

    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == code and len(lines) == 1, (result.exit_code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
