"""`kern test`: A/B logits on sampled prompts.

A is the target (its manifest, graph decode, its chunk). A generates `steps` greedy tokens per prompt;
then both sides are teacher-forced over prompt + A's tokens (prefill of the prompt but its last token
in chunks, then one decode step per position) and their logits compared step by step. B is one of:

- `eager`: the same loaded runtime, decode replayed launch by launch (must be token-identical),
- `chunk1`: the same runtime, prefill in chunks of 1 token,
- a manifest path: another manifest on the same weights; A's device weights are kept with
  `Runtime.into_resident()` and B loads over them (identical weight buffers are not read again),
- `transformers`: the checkpoint's own model class (Qwen3ForCausalLM, LlamaForCausalLM) on the same checkpoint
  (kern_run.reference).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import session  # session.probe_device: the probe prepare() runs
from .compare import Comparison, compare_logits, table
from .config import RunConfig
from .errors import InputError, RefusalError, WeightsError
from .generate import GenerateOptions, Generator
from .session import open_generator, prepare
from .text import TextCodec

MAX_TEST_PROMPTS = 10_000  # `kern test --prompts`: the prompts are built before the first comparison runs
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "人工智能的发展历史可以追溯到",
    "In 1969, the Apollo 11 mission",
)


@dataclass(frozen=True)
class AbRequest:
    against: str = "eager"  # eager | chunk1 | transformers | path to a manifest
    prompts: int = 4
    steps: int = 32
    seed: int = 0
    random_prompt_tokens: int = 200  # length of the sampled random-token prompts
    margin_tol: float | None = None  # default: 0 for same-runtime modes, 0.1 otherwise


def sample_prompts(codec: TextCodec, count: int, seed: int, random_tokens: int, max_tokens: int) -> list[list[int]]:
    """Fixed natural prompts first, then seeded random-token prompts (ids of the tokenizer's base
    vocabulary, below its added special tokens: 151643 for Qwen's BPE, the trained size for others)."""
    prompts = [codec.encode(p) for p in PROMPTS[:count]]
    rng = np.random.default_rng(seed)
    base_vocab = codec.tokenizer.get_vocab_size(with_added_tokens=False)
    while len(prompts) < count:
        length = int(min(max_tokens, random_tokens * (1 + len(prompts) - len(PROMPTS))))
        prompts.append(rng.integers(0, base_vocab, size=max(length, 2)).tolist())
    return [p[:max_tokens] for p in prompts]


MODES = ("eager", "chunk1", "transformers")


def check_request(req: AbRequest, cfg: RunConfig) -> "RunConfig | None":
    """Refuse a request that cannot run, before anything loads: returns B's RunConfig when B is a manifest.
    Raises InputError (bad counts, a negative seed, an unknown mode that is no manifest file) / ConfigError (B's
    preflight: bad manifest, kernels, weights) / WeightsError (transformers mode with a --weights file or file
    list without config.json beside its first file, or a bad entry in the list) / RefusalError (transformers mode
    without torch + transformers)."""
    if req.prompts < 1:
        raise InputError(f"--prompts {req.prompts}: need at least 1 prompt")
    if req.prompts > MAX_TEST_PROMPTS:
        raise InputError(f"--prompts {req.prompts}: at most {MAX_TEST_PROMPTS} prompts (each is a generation and a "
                         "teacher-forced pass on both sides)")
    if req.steps < 1:
        raise InputError(f"--steps {req.steps}: need at least 1 step")
    if req.seed < 0:
        raise InputError(f"--seed {req.seed}: must be >= 0 (it seeds numpy's random prompts)")
    if req.margin_tol is not None and not req.margin_tol >= 0:
        raise InputError(f"--margin-tol {req.margin_tol}: must be >= 0")
    if req.against == "transformers":
        import importlib.util

        from .preflight import checkpoint_files, weight_list_files

        files = weight_list_files(cfg.weights)  # one path: unchecked by weight_list_files
        if len(files) == 1:
            checkpoint_files(files[0])  # a missing path or an empty directory is named before the torch check
        if len(files) > 1 or files[0].is_file():  # .safetensors file(s): the HF config is beside the first
            config = files[0].parent / "config.json"
            if not config.is_file():
                what = "a --weights file list" if len(files) > 1 else "a --weights file"
                raise WeightsError(f"--against transformers with {what} reads the HF config.json beside the first "
                                   f"file ({files[0]}), and {config} does not exist: copy the model's config.json "
                                   "there, or pass the checkpoint directory as --weights")

        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise RefusalError(f"--against transformers needs {' and '.join(missing)}, not installed here "
                               "(pip install torch transformers)")
        return None
    if req.against in MODES:
        return None
    path = Path(req.against)
    if not path.is_file():
        raise InputError(f"--against {req.against!r}: not one of {', '.join(MODES)} and not a manifest file")
    return replace(cfg, manifest=path, chunk=None)


def check_steps(steps: int, positions: int, where: str) -> None:
    """A prompt of at least 1 token plus `steps` generated tokens must fit `positions`. Raises InputError naming
    --steps and `where` the positions come from."""
    if steps >= positions:
        raise InputError(f"--steps {steps}: the context holds {positions} positions ({where}), and each prompt needs "
                         f"at least 1: pass --steps <= {positions - 1}")


def context_positions(cfg: RunConfig, facts: Any, facts_b: Any = None) -> tuple[int, str]:
    """(positions a sequence can use, what bounds them) known before loading: the manifest's max context (and
    manifest B's), and the KV capacity."""
    limits = [(facts.max_context, f"the manifest's max context {facts.max_context}"),
              (cfg.capacity_tokens, f"--capacity {cfg.capacity_tokens}")]
    if facts_b is not None:
        limits.append((facts_b.max_context, f"manifest B's max context {facts_b.max_context}"))
    return min(limits, key=lambda limit: limit[0])


def run_ab(cfg: RunConfig, req: AbRequest, log: Any) -> tuple[list[Comparison], str]:
    """The comparisons (one per prompt) and a printable table. Raises RefusalError (InputError for `--steps` that
    leave no position for a prompt: before loading against the manifests' context and --capacity, after it against
    the KV pool the runtime allocated) / KernError."""
    cfg_b = check_request(req, cfg)
    prep = prepare(cfg, check_device=False)
    prep_b = prepare(cfg_b, check_device=False) if cfg_b is not None else None  # B's refusals before A loads
    check_steps(req.steps, *context_positions(cfg, prep.facts, prep_b.facts if prep_b is not None else None))
    session.probe_device(cfg.gpu)  # last: every host-side refusal of A and B comes first (docs/caller.md)
    same_runtime = req.against in ("eager", "chunk1")
    tol = req.margin_tol if req.margin_tol is not None else (0.0 if same_runtime else 0.1)
    work: list[tuple[list[int], list[int], np.ndarray, np.ndarray | None]] = []
    gen = open_generator(prep, log)
    try:
        positions = gen.max_positions  # the KV pool the runtime allocated may hold a little less than --capacity
        if prep_b is not None:
            positions = min(positions, prep_b.facts.max_context)
        check_steps(req.steps, positions, "the loaded KV pool")
        prompts = sample_prompts(prep.codec, req.prompts, req.seed, req.random_prompt_tokens,
                                 positions - req.steps)
        for prompt in prompts:
            result = gen.generate(prompt, GenerateOptions(req.steps, prep.chunk, stop_at_eos=False))
            ids = prompt + result.tokens[:-1]
            start = len(prompt) - 1
            logits_a, _ = gen.teacher_forced(ids, start, prep.chunk)
            logits_b = None
            if same_runtime:
                chunk_b = 1 if req.against == "chunk1" else prep.chunk
                logits_b, _ = gen.teacher_forced(ids, start, chunk_b, eager=req.against == "eager")
            work.append((prompt, result.tokens, logits_a, logits_b))
    except BaseException:
        gen.close()
        raise
    if req.against in ("eager", "chunk1", "transformers"):
        gen.close()
    if req.against == "transformers":
        from .reference import HfReference

        ref = HfReference(cfg.weights, cfg.gpu)
        work = [(p, t, a, ref.logits(p + t[:-1], len(p) - 1)) for p, t, a, _ in work]
        ref.close()
    elif prep_b is not None:
        gen.pages.release()
        resident = gen.rt.into_resident()  # None: the runtime keeps no weights (and is still open)
        if resident is None:
            gen.close()
            log.info("loading B after A is closed: the weights are read twice")
        with open_generator(prep_b, log, resident=resident) as gen_b:
            work = [(p, t, a, gen_b.teacher_forced(p + t[:-1], len(p) - 1, prep_b.chunk)[0]) for p, t, a, _ in work]
    comparisons = []
    rows = []
    for i, (prompt, tokens, a, b) in enumerate(work):
        c = compare_logits(a, b, tol)  # type: ignore[arg-type]
        comparisons.append(c)
        fd = c.first_divergence
        rows.append((str(i), str(len(prompt)), str(len(tokens)), f"{c.max_abs:.4f}", f"{c.max_rel:.2e}",
                     f"{100 * c.top1_agreement:.1f}%", "-" if fd is None else str(fd), str(len(c.hard_mismatches))))
    text = table(rows, ("prompt", "tokens", "steps", "max|err|", "max rel", "top1", "first div", "hard"))
    return comparisons, f"A = {cfg.manifest.name} (graph, chunk {prep.chunk}), B = {req.against}, margin tol {tol}\n{text}"
