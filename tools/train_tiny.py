#!/usr/bin/env python3
"""Train kern's tiny default model: a ~13M-parameter Qwen3 (qk-norm, GQA, tied embeddings) on English prose.

Steps, all seeded: read the corpus from tools/build_corpus.py (documents separated by `<|endoftext|>` lines,
gzip or plain); hold out every 50th document for validation; train a byte-level BPE tokenizer (`tokenizers`,
vocab 8192, `<|endoftext|>` = id 0 = EOS) on a bounded sample of the training documents; tokenize everything
with EOS after each document; train `transformers.Qwen3ForCausalLM` with AdamW, bf16 autocast and a cosine
learning-rate schedule driven by the wall clock, until `--minutes` after the script started; report the
validation loss of the saved bf16 weights; print greedy continuations of five fixed prompts; and write a
Hugging Face checkpoint (config.json, safetensors shards each under 16 MB + index, generation_config.json,
tokenizer.json, tokenizer_config.json, train_report.json) that is loaded back and checked before exit.

The weights kept are those with the best validation loss seen at the periodic evaluations (the corpus is
small next to what an H200 reads in minutes, so late steps can over-fit).

Validation loss and samples are measured on the checkpoint loaded back from disk, after checking that every
tensor in it is bit-identical to the trained bf16 weights.

Exit status: 0 on success, 2 on a non-finite loss, 3 when the reloaded checkpoint's tensors differ.
The whole run ends within about `--minutes` + 1 minute: setup counts against the training budget, and the
final evaluation, samples and save take well under a minute on a GPU.

GPU run (the lead's step): python3 tools/train_tiny.py --corpus corpus/tiny-corpus.txt.gz --out $OUT/qwen3-tiny \
    --minutes 5
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import inspect
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DOC_SEPARATOR = "<|endoftext|>"
EOS_TOKEN = "<|endoftext|>"
PROMPTS = (
    "The following example shows how to",
    "If the file does not exist,",
    "In this chapter, we will",
    "A process can",
    "The main advantage of this approach is",
)
MAX_FILE_BYTES = 16_000_000  # every checkpoint file must stay under this (16 MB)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; written verbatim into train_report.json."""

    corpus: str
    out: str
    minutes: float = 5.0  # wall-clock budget, counted from the script's start, for setup + training
    seed: int = 1234
    # model (Qwen3 architecture)
    vocab_size: int = 8192
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1024
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    # optimisation
    seq_tokens: int = 512
    batch_seqs: int = 128  # 65,536 tokens per step
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.1
    warmup_steps: int = 150
    grad_clip: float = 1.0
    max_steps: int = 0  # 0 = no step limit (the time budget decides); tests set a few
    # data
    val_every_docs: int = 50  # every Nth document is held out
    tokenizer_sample_bytes: int = 24_000_000  # most bytes of training text the BPE trainer reads
    eval_tokens: int = 262_144  # validation tokens per evaluation (fixed windows)
    # bookkeeping
    log_every_s: float = 20.0
    eval_every_s: float = 60.0
    final_reserve_s: float = 0.0  # seconds kept back from the training loop for the final steps
    device: str = "auto"
    compile: bool = False
    sample_tokens: int = 40


def log(message: str) -> None:
    print(f"[train_tiny {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------------
# Data and tokenizer (no torch needed: tests/train/ runs these without it)
# ---------------------------------------------------------------------------------------------------------


def read_documents(path: Path) -> list[str]:
    """Documents of a corpus file (gzip when the name ends in .gz), split on DOC_SEPARATOR lines."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    docs = [d.strip() for d in text.split("\n" + DOC_SEPARATOR + "\n")]
    return [d for d in docs if d]


def split_documents(docs: list[str], val_every_docs: int) -> tuple[list[str], list[str]]:
    """(train, validation): document i is held out when i % val_every_docs == val_every_docs // 2."""
    train, val = [], []
    for i, doc in enumerate(docs):
        (val if i % val_every_docs == val_every_docs // 2 else train).append(doc)
    return train, val


def train_tokenizer(docs: list[str], vocab_size: int, sample_bytes: int):
    """Byte-level BPE trained on documents taken in sha1 order up to sample_bytes; EOS_TOKEN gets id 0.

    Byte-level means every string round-trips exactly and no input is unknown.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    sample, total = [], 0
    for doc in sorted(docs, key=lambda d: hashlib.sha1(d.encode()).digest()):
        if total >= sample_bytes:
            break
        sample.append(doc)
        total += len(doc)
    tokenizer.train_from_iterator(sample, trainer=trainer, length=len(sample))
    assert tokenizer.token_to_id(EOS_TOKEN) == 0, "special tokens are added first"
    return tokenizer


def encode_documents(tokenizer, docs: list[str]) -> list[int]:
    """Token ids of all documents, each followed by the EOS id."""
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(docs, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return ids


# ---------------------------------------------------------------------------------------------------------
# Model, schedule, training
# ---------------------------------------------------------------------------------------------------------


def make_qwen3_config(cfg: TrainConfig, eos_id: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over warmup_steps, then cosine from lr to lr*min_lr_ratio as progress goes 0 -> 1.

    progress is the fraction of the training time budget used (or of max_steps when that is set).
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def _loss(model, windows):
    import torch.nn.functional as F

    # windows: [B, S+1] int64 -> inputs [B, S], targets [B, S]
    logits = model(input_ids=windows[:, :-1]).logits  # [B, S, V]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


def evaluate(model, val_ids, cfg: TrainConfig, autocast: bool) -> float:
    """Mean next-token loss (nats) over fixed, non-overlapping validation windows of seq_tokens + 1."""
    import torch

    # val_ids: [N] int64 on the model's device
    n_windows = max(1, min(cfg.eval_tokens, val_ids.numel() - 1) // cfg.seq_tokens)
    starts = torch.arange(n_windows, device=val_ids.device) * cfg.seq_tokens
    offsets = torch.arange(cfg.seq_tokens + 1, device=val_ids.device)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n_windows, cfg.batch_seqs):
            idx = starts[i : i + cfg.batch_seqs, None] + offsets  # [b, S+1]
            idx = idx.clamp_max(val_ids.numel() - 1)
            with torch.autocast(val_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = _loss(model, val_ids[idx])
            total += loss.item() * idx.shape[0]
            count += idx.shape[0]
    model.train()
    return total / count


def generate_samples(model, tokenizer, device, max_new_tokens: int) -> list[str]:
    """Greedy continuations (no sampling, no penalties) of PROMPTS."""
    import torch

    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    model.eval()
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids], device=device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id)
            outputs.append(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
    model.train()
    return outputs


def save_checkpoint(model, tokenizer, out: Path, cfg: TrainConfig) -> None:
    """Hugging Face layout: bf16 safetensors shards (each < MAX_FILE_BYTES) + index, configs, tokenizer."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                                               do_sample=False)
    save_kwargs = {"max_shard_size": "12MB"}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4.x; 5.x always writes safetensors
    model.to(torch.bfloat16).save_pretrained(out, **save_kwargs)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   model_max_length=cfg.max_position_embeddings, clean_up_tokenization_spaces=False)
    fast.save_pretrained(out)
    # transformers 5 writes its own class name ("TokenizersBackend"); the 4.x name loads under 4.x and 5.x.
    tok_config_path = out / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_path.write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")
    # Readers written against either transformers 4 or 5 config keys find what they expect.
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("torch_dtype", "bfloat16")
    config.setdefault("dtype", "bfloat16")
    config.setdefault("rope_theta", cfg.rope_theta)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    too_big = [f"{p.name} ({p.stat().st_size} bytes)" for p in out.iterdir() if p.stat().st_size >= MAX_FILE_BYTES]
    if too_big:
        raise RuntimeError(f"checkpoint files at or over {MAX_FILE_BYTES} bytes: {', '.join(too_big)}")


def load_checkpoint(out: Path, device):
    """The saved checkpoint loaded back the way a consumer would: Qwen3ForCausalLM.from_pretrained, bf16."""
    import torch
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(out, dtype=torch.bfloat16).to(device).eval()


def pick_device(name: str):
    import torch

    if name != "auto":
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run(cfg: TrainConfig, script_start: float) -> dict:
    """Train, evaluate, sample and save; returns the report written to train_report.json."""
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars garble an unbuffered log
    deadline = script_start + cfg.minutes * 60.0 - cfg.final_reserve_s
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        log(f"device {device}, torch {torch.__version__}")

    corpus_path = Path(cfg.corpus)
    docs = read_documents(corpus_path)
    train_docs, val_docs = split_documents(docs, cfg.val_every_docs)
    log(f"corpus {corpus_path}: {len(docs)} documents ({len(train_docs)} train, {len(val_docs)} validation), "
        f"{sum(map(len, docs)):,} characters")
    t0 = time.time()
    tokenizer = train_tokenizer(train_docs, cfg.vocab_size, cfg.tokenizer_sample_bytes)
    log(f"tokenizer: byte-level BPE, vocab {tokenizer.get_vocab_size()}, trained in {time.time() - t0:.1f} s")
    t0 = time.time()
    train_ids = torch.tensor(encode_documents(tokenizer, train_docs), dtype=torch.int64, device=device)  # [N]
    val_ids = torch.tensor(encode_documents(tokenizer, val_docs), dtype=torch.int64, device=device)  # [M]
    log(f"tokens: {train_ids.numel():,} train, {val_ids.numel():,} validation "
        f"({sum(map(len, train_docs)) / max(1, train_ids.numel()):.2f} characters/token), {time.time() - t0:.1f} s")
    if train_ids.numel() <= cfg.seq_tokens + 1 or val_ids.numel() <= cfg.seq_tokens + 1:
        raise ValueError(f"corpus too small for seq_tokens={cfg.seq_tokens}: {train_ids.numel()} train and "
                         f"{val_ids.numel()} validation tokens")

    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    model = Qwen3ForCausalLM(make_qwen3_config(cfg, eos_id)).to(device)
    model.config.use_cache = True
    n_params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    log(f"model: Qwen3ForCausalLM {n_params:,} parameters ({n_params * 2 / 1e6:.1f} MB in bf16)")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=on_cuda,
    )
    step_fn = torch.compile(model) if cfg.compile else model
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    offsets = torch.arange(cfg.seq_tokens + 1, device=device)  # [S+1]
    tokens_per_step = cfg.batch_seqs * cfg.seq_tokens

    loop_start = time.time()
    budget_s = max(1.0, deadline - loop_start)
    log(f"training: {tokens_per_step:,} tokens/step, time budget {budget_s:.0f} s"
        + (f", at most {cfg.max_steps} steps" if cfg.max_steps else ""))
    step, last_log, last_eval = 0, loop_start, loop_start
    window_loss = torch.zeros((), device=device)
    window_steps = 0
    best = {"val_loss": float("inf"), "step": -1, "state": None}
    history = []
    while True:
        now = time.time()
        progress = step / cfg.max_steps if cfg.max_steps else (now - loop_start) / budget_s
        if progress >= 1.0 or now >= deadline:
            break
        lr = lr_at(cfg, step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - cfg.seq_tokens - 1, (cfg.batch_seqs, 1), device=device,
                               generator=generator)  # [B, 1]
        windows = train_ids[starts + offsets]  # [B, S+1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
            loss = _loss(step_fn, windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window_loss += loss.detach()
        window_steps += 1
        step += 1
        if step % 10 == 0 or cfg.max_steps:
            now = time.time()
            if not math.isfinite(loss.item()):  # also bounds how far the host runs ahead of the GPU
                log(f"non-finite loss {loss.item()} at step {step}; stopping")
                sys.exit(2)
            if now - last_log >= cfg.log_every_s:
                elapsed = now - loop_start
                log(f"step {step:6d}  loss {window_loss.item() / window_steps:.4f}  lr {lr:.2e}  "
                    f"{step * tokens_per_step / elapsed / 1e3:,.0f}k tok/s  "
                    f"epochs {step * tokens_per_step / train_ids.numel():.2f}  {elapsed:.0f}/{budget_s:.0f} s")
                window_loss.zero_()
                window_steps, last_log = 0, now
            if now - last_eval >= cfg.eval_every_s:
                val_loss = evaluate(model, val_ids, cfg, autocast=on_cuda)
                history.append({"step": step, "seconds": round(now - loop_start, 1), "val_loss": round(val_loss, 4)})
                log(f"step {step:6d}  validation loss {val_loss:.4f}")
                if val_loss < best["val_loss"]:
                    best = {"val_loss": val_loss, "step": step,
                            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
                last_eval = time.time()
    train_seconds = time.time() - loop_start
    final_val = evaluate(model, val_ids, cfg, autocast=on_cuda)
    log(f"training done: {step} steps, {step * tokens_per_step:,} tokens, {train_seconds:.0f} s; "
        f"final validation loss {final_val:.4f}")
    history.append({"step": step, "seconds": round(train_seconds, 1), "val_loss": round(final_val, 4)})
    if not math.isfinite(final_val):
        log("non-finite validation loss; stopping")
        sys.exit(2)
    kept_step = step
    if best["state"] is not None and best["val_loss"] < final_val:
        model.load_state_dict(best["state"])
        kept_step = best["step"]
        log(f"keeping the weights of step {kept_step} (validation loss {best['val_loss']:.4f})")

    out = Path(cfg.out)
    model = model.to(torch.bfloat16)
    save_checkpoint(model, tokenizer, out, cfg)
    saved = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    del model, best
    # Everything below measures the checkpoint as others will load it (transformers recomputes buffers such
    # as RoPE's inv_freq in fp32, which a cast of the in-memory model had rounded to bf16).
    model = load_checkpoint(out, device)
    mismatched = sorted(name for name, tensor in model.state_dict().items()
                        if name not in saved or not torch.equal(tensor, saved[name]))
    if mismatched:
        log(f"reloaded checkpoint differs from the trained weights in {mismatched}")
        sys.exit(3)
    log(f"reloaded {out} with Qwen3ForCausalLM.from_pretrained: all {len(saved)} tensors bit-identical")
    val_bf16 = evaluate(model, val_ids, cfg, autocast=False)
    log(f"VALIDATION LOSS (bf16 checkpoint as saved): {val_bf16:.4f} nats/token, perplexity {math.exp(val_bf16):.1f}")
    samples = generate_samples(model, tokenizer, device, cfg.sample_tokens)
    for prompt, text in zip(PROMPTS, samples):
        log(f"sample (greedy) {prompt!r} -> {text!r}")
    report = {
        "config": dataclasses.asdict(cfg),
        "parameters": n_params,
        "corpus_sha256": hashlib.sha256(corpus_path.read_bytes()).hexdigest(),
        "train_tokens": train_ids.numel(),
        "val_tokens": val_ids.numel(),
        "steps": step,
        "kept_step": kept_step,
        "tokens_seen": step * tokens_per_step,
        "train_seconds": round(train_seconds, 1),
        "val_loss_bf16": round(val_bf16, 4),
        "val_history": history,
        "samples": dict(zip(PROMPTS, samples)),
        "device": torch.cuda.get_device_name(device) if on_cuda else str(device),
        "torch": torch.__version__,
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    files = sorted((p.name, p.stat().st_size) for p in out.iterdir())
    log("wrote " + ", ".join(f"{name} ({size:,} B)" for name, size in files))
    return report


def parse_args(argv: list[str] | None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = TrainConfig(corpus="", out="")
    parser.add_argument("--corpus", required=True, help="corpus file from tools/build_corpus.py (.txt or .txt.gz)")
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("corpus", "out"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=getattr(defaults, f.name))
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            parser.add_argument(flag, type=kind, default=getattr(defaults, f.name))
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    script_start = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never wait on a network
    cfg = parse_args(argv)
    log("config " + json.dumps(dataclasses.asdict(cfg)))
    run(cfg, script_start)
    log(f"done in {time.time() - script_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
