"""bench/decode_attention.py on the CPU: its case parsing, its floor, and the exit without a GPU."""

from __future__ import annotations

import pytest

from bench import decode_attention as bda


def test_cases_parse_and_refuse_with_the_item_named() -> None:
    assert bda.parse_cases("64x576,1x2048,") == [(64, 576), (1, 2048)]
    for bad, why in (("64x", "is not ROWSxCTX"), ("64*576", "is not ROWSxCTX"), ("0x576", "outside"),
                     ("64x70000", "outside")):
        with pytest.raises(SystemExit) as err:
            bda.parse_cases(f"8x128,{bad}")
        assert repr(bad) in str(err.value) and why in str(err.value)


def test_floor_is_every_rows_kv_once_at_the_copy_rate() -> None:
    """64 rows x 576 tokens: 64 x 576 x 8 kv heads x 128 x 2 (K, V) x 2 bytes of K/V, plus q in and out, at
    4.3 TB/s: 35.36 us (docs/perf.md "Twenty-fourth session")."""
    want = 64 * (576 * 8 * 128 * 2 * 2 + 32 * 128 * 2 * 2) / 4.3e12 * 1e6
    assert bda.floor_us(64, 576) == pytest.approx(want)
    assert round(bda.floor_us(64, 576), 2) == 35.36


def test_unknown_variant_is_refused_before_the_gpu() -> None:
    with pytest.raises(SystemExit) as err:
        bda.main(["--variants", "gqa,rows3"])
    assert "unknown ['rows3']" in str(err.value)


def test_without_a_gpu_it_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu():
        raise SystemExit(3)

    monkeypatch.setattr(bda, "open_gpu", no_gpu)
    with pytest.raises(SystemExit) as err:
        bda.main(["--cases", "1x128"])
    assert err.value.code == 3


def test_split_tokens_parse_and_refuse() -> None:
    assert bda.parse_split_tokens("64,256") == [64, 256]
    assert bda.parse_split_tokens("") == [64]
    for bad in ("0", "24", "-16", "x"):
        with pytest.raises(SystemExit) as err:
            bda.parse_split_tokens(f"64,{bad}")
        assert repr(bad) in str(err.value)
