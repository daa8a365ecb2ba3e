"""Kernel directory: only the pinned files are read, hashes are checked; ABI instance choice."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kern_runtime import KernelArtifactError
from kern_runtime.modules import choose_instance, module_path, read_pinned_modules


def fake_cubin(directory: Path, module: str, payload: bytes) -> str:
    digest = hashlib.sha256(payload).hexdigest()
    (directory / f"{module}-{digest[:12]}.cubin").write_bytes(payload)
    return digest


def test_reads_exactly_the_pinned_files(tmp_path: Path) -> None:
    digest = fake_cubin(tmp_path, "norm", b"\x7fELF fake norm")
    # an unreadable stranger in the directory must never be touched
    stranger = tmp_path / "other-000000000000.cubin"
    stranger.write_bytes(b"x")
    stranger.chmod(0)
    (tmp_path / "norm-ffffffffffff.cubin").write_bytes(b"an older build")
    images = read_pinned_modules(tmp_path, {"norm": digest})
    assert images == {"norm": b"\x7fELF fake norm"}
    assert module_path(tmp_path, "norm", digest).name == f"norm-{digest[:12]}.cubin"


def test_missing_cubin_names_module_hash_and_path(tmp_path: Path) -> None:
    digest = "0123456789ab" + "0" * 52
    with pytest.raises(KernelArtifactError) as info:
        read_pinned_modules(tmp_path, {"attn": digest})
    text = str(info.value)
    assert "module 'attn'" in text and digest in text and str(tmp_path / "attn-0123456789ab.cubin") in text
    assert "missing" in text


def test_mismatched_cubin_is_refused(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"the pinned build").hexdigest()
    path = tmp_path / f"act-{digest[:12]}.cubin"
    path.write_bytes(b"a different build with the same file name")
    with pytest.raises(KernelArtifactError, match=rf"module 'act': .*act-{digest[:12]}.cubin has sha256 [0-9a-f]{{64}}, the manifest pins {digest}"):
        read_pinned_modules(tmp_path, {"act": digest})


def test_choose_instance_by_layout() -> None:
    a = ("fn_a", ((0, 8), (8, 4)))
    b = ("fn_b", ((0, 8), (8, 8), (16, 8)))
    assert choose_instance([a, b], ((0, 8), (8, 8), (16, 8)), "x") == "fn_b"
    assert choose_instance([a, b], ((0, 8), (8, 4)), "x") == "fn_a"
    with pytest.raises(KernelArtifactError, match=r"ABI mismatch: the manifest's params \[\[0, 8\], \[8, 8\]\] match none of the 2"):
        choose_instance([a, b], ((0, 8), (8, 8)), "x")
    with pytest.raises(KernelArtifactError, match="no function of that name"):
        choose_instance([], ((0, 8),), "x")
    with pytest.raises(KernelArtifactError, match="ambiguous"):
        choose_instance([a, ("fn_c", a[1])], a[1], "x")
