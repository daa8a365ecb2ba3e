"""Tokenizer and stop tokens of a Hugging Face checkpoint directory, and streaming detokenization.

The tokenizer is `tokenizer.json` next to the weights (in the checkpoint directory, or beside the weights
file: the first file of a `--weights` list), loaded with the `tokenizers` library. Stop tokens are the union
of `eos_token_id` in generation_config.json and config.json (an int or a list).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from .errors import InputError
from .jsonfile import MAX_TOKENIZER_BYTES, bounded, read_json, read_text


def checkpoint_dir(weights: Any) -> Path:
    """The directory holding config/tokenizer files: `weights` itself, or a weights file's directory; for a
    list of .safetensors files (config.Weights), the directory of the first."""
    if not isinstance(weights, (str, Path)):
        weights = list(weights)[0]
    weights = Path(weights)
    return weights if weights.is_dir() else weights.parent


@dataclass(frozen=True)
class TextCodec:
    """A loaded tokenizer plus the checkpoint's stop token ids."""

    tokenizer: object  # tokenizers.Tokenizer
    eos_ids: frozenset[int]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. `add_special_tokens`: also what tokenizer.json's post-processor puts around a whole
        prompt, as transformers' tokenizer(text) does (Llama 3: BOS first; Qwen: nothing); off by default, for
        text that already holds its special tokens (a rendered chat template)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def eos_ids_of(ckpt: Path) -> frozenset[int]:
    """Stop token ids from generation_config.json and config.json (either may be missing).

    Raises InputError naming the file when it is not a UTF-8 JSON object or its `eos_token_id` is not a
    token id (int >= 0), a list of them, or null."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = ckpt / name
        if not path.is_file():
            continue
        raw = read_json(path, "checkpoint config", InputError, ": fix or remove it")
        if not isinstance(raw, dict):
            raise InputError(f"{path}: expected a JSON object, found a {type(raw).__name__}: fix or remove it")
        value = raw.get("eos_token_id")
        if _token_id(value):
            ids.add(value)
        elif isinstance(value, list) and all(_token_id(v) for v in value):
            ids.update(value)
        elif value is not None:
            raise InputError(f"{path}: eos_token_id = {value!r} must be a token id (int >= 0) or a list of them")
    return frozenset(ids)


def load_codec(weights: Any) -> TextCodec:
    """TextCodec of the checkpoint at `weights`. Raises InputError when tokenizer.json is missing or unusable,
    or a config file's eos_token_id is malformed."""
    from tokenizers import Tokenizer

    ckpt = checkpoint_dir(weights)
    path = ckpt / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"no tokenizer.json next to the weights ({path}); make_checkpoint.py writes one, "
                         "or copy the model's tokenizer.json there")
    text = read_text(path, "tokenizer", InputError, ": copy the model's tokenizer.json there",
                     bounded(MAX_TOKENIZER_BYTES))
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for any bad file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{path} is not a usable tokenizer.json ({reason}): copy the model's tokenizer.json "
                         "there") from None
    return TextCodec(tokenizer, eos_ids_of(ckpt))


class StreamDecoder:
    """Incremental detokenization: `push(id)` returns the new complete text (maybe "").

    Byte-level BPE can split one UTF-8 character across tokens, so text is emitted only once the
    decoded suffix no longer ends in U+FFFD; decoding restarts from a few tokens back (`prefix`) so each
    push costs O(window), not O(generated).
    """

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] decode to text already emitted (context for the next piece)
        self._read = 0

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._codec.decode(self._ids[self._prefix:self._read])
        after = self._codec.decode(self._ids[self._prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix = self._read
        self._read = len(self._ids)
        return after[len(before):]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a final incomplete character, rendered as U+FFFD)."""
        before = self._codec.decode(self._ids[self._prefix:self._read])
        after = self._codec.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return after[len(before):] if len(after) > len(before) else ""

    def writer(self, out: TextIO) -> Callable[[int], None]:
        """An `on_token` callback that writes each new piece of text to `out` as it completes (flushed)."""
        def emit(token_id: int) -> None:
            text = self.push(token_id)
            if text:
                out.write(text)
                out.flush()

        return emit

    def finish(self, out: TextIO) -> None:
        """Write what is held back and end the line."""
        out.write(self.flush() + "\n")
        out.flush()


def text_fault(text: str) -> str | None:
    """Why `text` is not Unicode text the tokenizer can take, or None: a surrogate code point, which no UTF-8
    text decodes to. Python makes one of each undecodable byte of a command-line argument (U+DC80..U+DCFF,
    the `surrogateescape` of byte 0x80..0xff), and JSON's `\\ud800` escapes write lone ones."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if 0xDC80 <= code <= 0xDCFF:
            return f"byte 0x{code - 0xDC00:02x} at character {exc.start}"
        return f"a lone surrogate U+{code:04X} at character {exc.start}"
    return None


def checked_prompt(codec: TextCodec, prompt: str) -> list[int]:
    """Token ids of a prompt, with the special tokens the tokenizer adds to one (Llama 3: BOS). Raises InputError
    for a prompt that is not UTF-8 text or encodes to no tokens."""
    fault = text_fault(prompt)
    if fault is not None:
        raise InputError(f"the prompt is not UTF-8 text ({fault}): pass a UTF-8 --prompt")
    ids = codec.encode(prompt, add_special_tokens=True)
    if not ids:
        raise InputError("the prompt encodes to no tokens: pass a non-empty --prompt")
    return ids
