"""Kernel directory: only the pinned files are read, hashes are checked; ABI instance choice; per-function
attributes (dynamic shared memory limit, preferred carveout) and the carveout of the spec."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from runtime_helpers import base_manifest, scale_op

from kern_runtime import KernelArtifactError, ManifestError, ManifestParseError, ManifestVerifyError
from kern_runtime.cuda.modules import choose_instance, function_attributes, module_path, read_pinned_modules
from kern_runtime.runtime import load_spec
from kern_manifest import Launch


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


# ---------------------------------------------------------------- function attributes (shared limit, carveout)


class FakeFunction:
    """Stands in for a CUfunction: told apart by `int()`, the handle."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


def test_function_attributes_aggregate_per_function() -> None:
    """Largest dynamic shared memory and the one carveout per function, over every launch of it; a launch
    without carveout neither sets nor conflicts."""
    f, g, h = FakeFunction(1), FakeFunction(2), FakeFunction(3)
    f_again = FakeFunction(1)  # another handle object of the same function (a second op's lookup)
    uses = [(f, "ops.a.launches[0]", 100 * 1024, None), (g, "ops.a.launches[1]", 0, 0),
            (f_again, "ops.b.launches[0]", 65536, 100), (f, "ops.c.launches[0]", 0, 100),
            (h, "ops.d.launches[0]", 0, None)]
    attrs = function_attributes(uses)
    assert [(int(a.function), a.shared_mem, a.carveout, a.carveout_path) for a in attrs] == [
        (1, 100 * 1024, 100, "ops.b.launches[0]"), (2, 0, 0, "ops.a.launches[1]"), (3, 0, None, "")]
    assert attrs[0].function is f
    assert function_attributes([]) == []


def test_function_attributes_refuse_two_carveouts_for_one_function() -> None:
    f = FakeFunction(7)
    uses = [(f, "ops.a.launches[0]", 0, 100), (FakeFunction(8), "ops.b.launches[0]", 0, 50),
            (FakeFunction(7), "ops.c.launches[2]", 0, 50)]
    with pytest.raises(ManifestError, match=re.escape("ops.c.launches[2].carveout: 50 differs from carveout 100 at "
                                                      "ops.a.launches[0].carveout, a launch of the same function")):
        function_attributes(uses)


def carveout_manifest(*carveouts: int | None) -> dict:
    """One op per value in `carveouts`, each launching toy's kern_scale (None: without carveout)."""
    ops = {}
    for i, carveout in enumerate(carveouts):
        op = scale_op()
        if carveout is not None:
            op["launches"][0]["carveout"] = carveout
        ops[f"scale{i}"] = op
    return base_manifest(modules={"toy": "ab" * 32}, ops=ops)


def test_spec_reads_carveout_of_each_launch() -> None:
    spec = load_spec(carveout_manifest(100, None, 100))
    assert [spec.ops[f"scale{i}"].launches[0].carveout for i in range(3)] == [100, None, 100]
    assert isinstance(spec.ops["scale0"].launches[0], Launch)


def test_runtime_refuses_bad_carveouts_before_touching_a_device() -> None:
    with pytest.raises(ManifestVerifyError) as info:  # the verifier's fault, re-raised as the runtime's error
        load_spec(carveout_manifest(100, 50))
    assert info.value.paths == ["$.ops.scale1.launches[0].carveout"]
    with pytest.raises(ManifestVerifyError) as info:
        load_spec(carveout_manifest(101))
    assert info.value.paths == ["$.ops.scale0.launches[0].carveout"]
    raw = carveout_manifest(100)
    for bad in (-1, 101, True, 50.5):  # parse or verify refuses each, with the JSON path
        raw["ops"]["scale0"]["launches"][0]["carveout"] = bad
        with pytest.raises((ManifestParseError, ManifestVerifyError)) as info:
            load_spec(raw)
        assert "$.ops.scale0.launches[0].carveout" in str(info.value)


def test_the_shared_memory_opt_in_counts_static_and_dynamic_together() -> None:
    """The 48 KiB default bounds static + dynamic shared memory: 40 KiB dynamic with 9.5 KiB static needs the opt-in
    (the multi-row GEMV at k = 2560 that failed to launch on the H200 without it), 40 KiB with 8 KiB does not; the
    static size is asked only when there is dynamic shared memory and it alone stays under the limit."""
    from kern_runtime.cuda.modules import needs_shared_opt_in

    asked: list[int] = []

    def static(n: int):
        return lambda: asked.append(n) or n

    assert needs_shared_opt_in(40960, static(9728)) is True
    assert needs_shared_opt_in(40960, static(8192)) is False
    assert needs_shared_opt_in(49153, static(0)) is True and asked == [9728, 8192]  # above 48 KiB alone: not asked
    assert needs_shared_opt_in(0, static(60000)) is False and asked == [9728, 8192]  # no dynamic memory: no opt-in
