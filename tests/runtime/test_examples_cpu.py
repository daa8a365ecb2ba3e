"""examples/custom_manifest.py and examples/decode_loop.py run against the fake driver (fake_cuda.py).

For custom_manifest.py the fake also executes the two kernels the example wires (kern_embed_gather,
kern_argmax_partial / kern_argmax_final) in numpy, reading their parameters through the `void**` the
runtime passes to cuLaunchKernel, so the example's own numpy check runs end to end on the CPU."""

from __future__ import annotations

import ast
import ctypes
import itertools
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cuda import OK, FakeDriver, fake_cuda  # noqa: F401 - the fixture
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example_main(name: str) -> Callable[[list[str]], int]:
    """The `main(argv) -> int` of examples/<name>.py (run as a script file: examples/ is not a package)."""
    return runpy.run_path(str(EXAMPLES / name), run_name="example")["main"]


def _params(address: int, layout: tuple[tuple[int, int], ...]) -> list[int]:
    """Each parameter's bytes as an unsigned little-endian int, read through the kernelParams void**."""
    pointers = (ctypes.c_void_p * len(layout)).from_address(address)
    return [int.from_bytes(ctypes.string_at(pointers[i], size), "little") for i, (_, size) in enumerate(layout)]


def _array(address: int, dtype: Any, count: int) -> np.ndarray:
    raw = (ctypes.c_uint8 * (count * np.dtype(dtype).itemsize)).from_address(address)
    return np.ctypeslib.as_array(raw).view(dtype)


def _i32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def _bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def run_kernels(fake: FakeDriver, function: Any, grid: tuple[int, int, int], params: int) -> tuple:
    """A launch of the embed and argmax entries, computed in numpy (the first index wins a tie)."""
    values = _params(int(params), fake.entries[function.entry])
    if function.entry == "kern_embed_gather":
        table, ids, out, n, hidden, vocab = values[:3] + [_i32(v) for v in values[3:]]
        idx = _array(ids, np.int32, n)
        rows = _array(table, np.uint16, vocab * hidden).reshape(vocab, hidden)
        gathered = np.where(((idx >= 0) & (idx < vocab))[:, None], rows[np.clip(idx, 0, vocab - 1)], 0)
        _array(out, np.uint16, n * hidden)[:] = gathered.reshape(-1)
    elif function.entry == "kern_argmax_partial":
        logits, n, chunk, part_val, part_idx, chunks = values[0], _i32(values[1]), _i32(values[2]), *values[3:5], \
            _i32(values[5])
        rows = grid[1]
        x = _bf16(_array(logits, np.uint16, rows * n)).reshape(rows, n)
        pv, pi = _array(part_val, np.float32, rows * chunks), _array(part_idx, np.int32, rows * chunks)
        for r in range(rows):
            for c in range(chunks):
                seg = x[r, c * chunk:(c + 1) * chunk]
                pv[r * chunks + c], pi[r * chunks + c] = seg.max(), c * chunk + int(seg.argmax())
    elif function.entry == "kern_argmax_final":
        part_val, part_idx, chunks, out = values[0], values[1], _i32(values[2]), values[3]
        rows = grid[0]
        pv = _array(part_val, np.float32, rows * chunks).reshape(rows, chunks)
        pi = _array(part_idx, np.int32, rows * chunks).reshape(rows, chunks)
        _array(out, np.int64, rows)[:] = pi[np.arange(rows), pv.argmax(axis=1)]
    return (OK,)


KERNEL_LAYOUTS = {
    "kern_embed_gather": ((0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4)),
    "kern_argmax_partial": ((0, 8), (8, 4), (12, 4), (16, 8), (24, 8), (32, 4)),
    "kern_argmax_final": ((0, 8), (8, 8), (16, 4), (24, 8)),
}


@pytest.fixture
def computing(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """The fake driver, executing the embed and argmax kernels."""
    fake_cuda.entries = dict(KERNEL_LAYOUTS)
    monkeypatch.setattr(FakeDriver, "_cuLaunchKernel", lambda self, f, gx, gy, gz, *rest:
                        run_kernels(self, f, (gx, gy, gz), rest[-2]), raising=False)
    return fake_cuda


def test_custom_manifest_matches_numpy(computing: FakeDriver, capsys: pytest.CaptureFixture[str]) -> None:
    main = example_main("custom_manifest.py")
    assert main(["--kernels", str(ROOT / "kernels"), "--tokens", "5", "--seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "matches numpy"
    assert computing.called("cuLaunchKernel") == 3  # embed, argmax partial, argmax final


def test_custom_manifest_reports_a_mismatch(computing: FakeDriver, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The check can fail: a device that runs no kernel leaves next_token zero, which numpy refutes."""
    monkeypatch.setattr(FakeDriver, "_cuLaunchKernel", lambda self, *a: (OK,))
    main = example_main("custom_manifest.py")
    assert main(["--kernels", str(ROOT / "kernels"), "--tokens", "5", "--seed", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("custom_manifest.py: numpy says [") and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "line"), [
    (["--tokens", "0"], "custom_manifest.py: --tokens 0: expected 1..64\n"),
    (["--tokens", "65"], "custom_manifest.py: --tokens 65: expected 1..64\n"),
    (["--tokens", "x"], "custom_manifest.py: argument --tokens: invalid int value: 'x'\n"),
])
def test_custom_manifest_bad_argument_is_one_line(argv: list[str], line: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    main = example_main("custom_manifest.py")
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == line


def test_custom_manifest_missing_kernels_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = example_main("custom_manifest.py")
    assert main(["--kernels", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"custom_manifest.py: --kernels {tmp_path / 'none'}: cannot read kernels.json (")
    assert err.count("\n") == 1


@pytest.fixture
def tiny_fake(fake_cuda: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """The fake driver showing the tiny manifest's kernel entries, cuBLASLt stubbed."""
    import kern_runtime.runtime
    from test_docstring_example_cpu import StubBlas, entry_layouts

    monkeypatch.setattr(kern_runtime.runtime, "Blas", StubBlas)
    fake_cuda.entries = entry_layouts()
    return fake_cuda


def test_decode_loop_drives_leases_checkpoint_and_reuse(tiny_fake: FakeDriver,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """On the fake every next_token reads 0 (no kernel runs), so both runs give the same zeros; what is checked
    is that the API sequence runs: 2 x steps decode steps, each a launch of the captured graph."""
    main = example_main("decode_loop.py")
    assert main(["--kernels", str(ROOT / "kernels"), "--prompt", "The capital of France is", "--steps", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prompt ids [392, 1493, 6034, 294, 7436, 691, 290]"
    tokenizer = Tokenizer.from_file(str(ROOT / "models" / "qwen3-tiny-en" / "tokenizer.json"))
    zeros = tokenizer.decode([0, 0, 0], skip_special_tokens=False)  # what the example prints for ids 0, 0, 0
    assert out[1:] == ["tokens     [0, 0, 0]", f"text       {zeros!r}",
                       "resumed from the checkpoint (6 tokens): the same 3 tokens"]
    assert tiny_fake.called("cuGraphLaunch") == 6  # decode: one capture, then every step launches the graph


@pytest.mark.parametrize(("argv", "line"), [
    (["--steps", "0"], "decode_loop.py: --steps 0: expected 1..512\n"),
    (["--steps", "513"], "decode_loop.py: --steps 513: expected 1..512\n"),
    (["--gpu"], "decode_loop.py: argument --gpu: expected one argument\n"),
])
def test_decode_loop_bad_argument_is_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        example_main("decode_loop.py")(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == line


def test_decode_loop_empty_prompt_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert example_main("decode_loop.py")(["--kernels", str(ROOT / "kernels"), "--prompt", ""]) == 2
    assert capsys.readouterr().err == "decode_loop.py: --prompt '': expected text with at least one token\n"


def test_decode_loop_reports_a_resumed_run_that_differs(tiny_fake: FakeDriver, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The check can fail: next_token counting up gives the resumed run other tokens than the first."""
    import kern_runtime

    counter = itertools.count()
    monkeypatch.setattr(kern_runtime.Runtime, "read_output", lambda self, name, rows=None: np.array([next(counter)]))
    assert example_main("decode_loop.py")(["--kernels", str(ROOT / "kernels"), "--steps", "3"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1] == "tokens     [0, 1, 2]"
    assert captured.err == "decode_loop.py: the run resumed from the checkpoint gave [3, 4, 5]\n"


def test_decode_loop_one_token_prompt_resumes_an_empty_checkpoint(tiny_fake: FakeDriver,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--kernels", str(ROOT / "kernels"), "--prompt", "Hello", "--steps", "2"]
    assert example_main("decode_loop.py")(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prompt ids [7378]"
    assert out[-1] == "resumed from the checkpoint (0 tokens): the same 2 tokens"


def test_decode_loop_prefills_a_long_prompt_in_chunks(tiny_fake: FakeDriver,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt past the prefill program's 512 tokens is prefilled in pieces of at most 512."""
    prompt = "Hello " * 700
    assert example_main("decode_loop.py")(["--kernels", str(ROOT / "kernels"), "--prompt", prompt, "--steps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(ast.literal_eval(out[0].removeprefix("prompt ids ")))
    assert n > 1025
    assert out[-1] == f"resumed from the checkpoint ({n - 1} tokens): the same 1 tokens"


def test_decode_loop_prompt_past_the_context_is_one_line(tiny_fake: FakeDriver,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert example_main("decode_loop.py")(["--kernels", str(ROOT / "kernels"), "--prompt", "Hello " * 2100,
                                           "--steps", "1"]) == 1
    assert capsys.readouterr().err == "decode_loop.py: lease holds 263 pages; block-table row 0 has room for 128\n"
