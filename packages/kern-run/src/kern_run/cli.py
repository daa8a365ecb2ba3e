"""The `kern` command line: thin wrappers that parse options into a config and call one function.

    kern run [--target T] [--prompt P | --prompts FILE] [--max-tokens N] [--chunk C] [--capacity K] [--eager] ...
             [--temperature T] [--top-p P] [--top-k K] [--min-p M] [--seed S] [--repetition-penalty R]
             [--stop STRING ...] [--logprobs] [--top-logprobs N] [--gpu G] ...
             [--weights DIR_OR_FILE | --weights A.safetensors --weights B.safetensors ...]
    kern run --weights DIR|ORG/NAME [--no-pins] ...   (no --manifest / --target: the manifest built from
             DIR/config.json and cached, kern_run.auto_manifest; ORG/NAME from the local HF cache)
    kern test [--against eager|chunk1|transformers|MANIFEST] [--prompts N] [--steps N]
    kern serve [--target T | --weights DIR [--no-pins]] [--host H] [--port P] [--max-seqs N] [--host-gib G] ...
    kern inspect MANIFEST
    kern manifest check MANIFEST
    kern manifest build (--config config.json | --shape S) [options] --out m.json   (kern_run.models.qwen3)
    kern kernels [ARGS...]          (tools/build_kernels.py: needs the kern checkout)
    kern harvest capture --weights DIR --out CAPTURE | mine CAPTURE | generate CAPTURE --out DIR
                                    (kern_run.harvest: another engine's kernels as a manifest; docs/harvest.md)
    kern --version                  (the four kern packages' installed versions)

Refusals (docs/caller.md) print one line on stderr and exit non-zero; a traceback only with
`--log-level debug`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import typer.core

from .config import check_numbers, find_toml, resolve_config
from .errors import RefusalError
from .log import resolve_level, setup_logging


def _click_exception() -> type[BaseException]:
    """The base class of click's usage errors as typer raises them: typer's vendored click (typer >= 0.2x) or click
    itself (older typer); found through `typer.BadParameter`, so no click import (kern-run does not declare it)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _given_value(opts: list[str], args: list[str]) -> tuple[str, str] | None:
    """(the flag as typed, its value) of option `opts` on the command line `args`, when it is there."""
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                return opt, args[i + 1]
            if opt.startswith("--") and arg.startswith(opt + "="):
                return opt, arg[len(opt) + 1:]
            if not opt.startswith("--") and arg.startswith(opt) and len(arg) > len(opt):
                return opt, arg[len(opt):]
    return None


def usage_error_line(exc: BaseException, args: list[str], group: Any = None) -> str:
    """One line for a click usage error (bad or missing option value, unknown option or command), as
    docs/caller.md promises for refusals: `kern run: --steps: 'abc' is not a valid integer`. `group`: the
    root command, to name the subcommand from `args` when the error carries no context."""
    import re

    ctx = getattr(exc, "ctx", None)
    names: list[str] = []
    if ctx is not None:
        while ctx.parent is not None:
            names.append(ctx.info_name or "")
            ctx = ctx.parent
        names.reverse()
    else:  # e.g. "option requires an argument": the words of `args` that name (sub)commands
        commands = getattr(group, "commands", None) or {}
        for arg in args:
            cmd = commands.get(arg)
            if cmd is None:
                break
            names.append(arg)
            commands = getattr(cmd, "commands", None) or {}
    command = " ".join(["kern", *[n for n in names if n]])
    param = getattr(exc, "param", None)
    opts = [o for o in (getattr(param, "opts", None) or []) if o.startswith("-")]
    # an option's own message ("Input should be ..."), or a BadParameter raised without one (--log-level) without
    # click's "Invalid value: " prefix; otherwise click's full message
    message = getattr(exc, "message", "") if opts or (param is None and type(exc).__name__ == "BadParameter") else ""
    message = _one_line(message or exc.format_message())  # type: ignore[attr-defined]
    if opts:
        given = _given_value(opts, args)
        flag = given[0] if given else max(opts, key=len)
        pydantic = re.match(r"Input should be (a valid \w+)", message)
        if given is not None and pydantic:
            message = f"{given[1]!r} is not {pydantic.group(1)}"
        elif given is not None and repr(given[1]) not in message:
            message = f"{given[1]!r}: {message}"
        return f"{command}: {flag}: {message.rstrip('.')}"
    return f"{command}: {message.rstrip('.')}"


class _OneLineUsageErrors(typer.core.TyperGroup):
    """kern's command group: a usage error (a flag value that does not parse, an unknown option or command, a
    missing argument) is one stderr line and exit 2 (docs/caller.md "Refusals") instead of click's usage box.
    Help (`--help`, no arguments) and every other exit are typer's."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _hide_flag_types(self)
        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        from kern_manifest import quiet_on_closed_pipe

        # a closed stdout (`kern inspect M | head -1`): exit 1 quietly, not a BrokenPipeError traceback
        sys.exit(quiet_on_closed_pipe(lambda: self._one_line_main(args, prog_name, complete_var, **extra)))

    def _one_line_main(self, args: Any, prog_name: str | None, complete_var: str | None, **extra: Any) -> int:
        argv = list(sys.argv[1:] if args is None else args)
        _ARGV[:] = argv
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
        except _click_exception() as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # the help (typer's rich help is printed already)
                text = exc.format_message()  # type: ignore[attr-defined]
                if text.strip():
                    print(text, file=sys.stderr)
            else:
                print(usage_error_line(exc, argv, self), file=sys.stderr)
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        return rv if isinstance(rv, int) else 0


def _hide_flag_types(command: Any) -> None:
    """No value type in the help of a flag (`--eager`, `--ignore-eos`, `--version`, `--help`): typer shows one
    (`--eager <bool>`), though a flag takes no value (`--eager true` is refused). Sets the metavar of every flag of
    `command` and its subcommands to "" (what the help prints as the type) unless one was given."""
    params = list(getattr(command, "params", []))
    help_option = getattr(command, "get_help_option", None)
    if help_option is not None:
        option = help_option(typer.Context(command))
        if option is not None:
            params.append(option)
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in (getattr(command, "commands", None) or {}).values():
        _hide_flag_types(sub)


app = typer.Typer(cls=_OneLineUsageErrors, add_completion=False, no_args_is_help=True,
                  help="kern: run LLM inference from a manifest.")
manifest_app = typer.Typer(no_args_is_help=True, help="Manifest tools.")
app.add_typer(manifest_app, name="manifest")
harvest_app = typer.Typer(no_args_is_help=True, help="Harvest torch.compile's kernels into a manifest (docs/harvest.md).")
app.add_typer(harvest_app, name="harvest")


def package_versions() -> str:
    """`kern-run X, kern-runtime Y, kern-manifest Z, kern-pool W`: each package's `__version__` (the one source
    its wheel's metadata is built from), so it also answers for packages on PYTHONPATH only, as on the GPU
    machine's tools/gpu-env.sh."""
    import importlib

    parts = []
    for dist in ("kern-run", "kern-runtime", "kern-manifest", "kern-pool"):
        module = importlib.import_module(dist.replace("-", "_"))
        parts.append(f"{dist} {module.__version__}")
    return ", ".join(parts)


def _print_version(value: bool) -> None:
    if value:
        print(package_versions())
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print the kern packages' versions and exit")] = False) -> None:
    """kern: run LLM inference from a manifest."""

TargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="kern.toml target (default: its `default`)")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="kern.toml path (default: $KERN_TOML or search up)")]
ManifestOpt = Annotated[Optional[Path], typer.Option("--manifest", help="manifest JSON")]
KernelsOpt = Annotated[Optional[Path], typer.Option("--kernels", help="kernels directory (<module>-<sha12>.cubin)")]
WeightsOpt = Annotated[Optional[list[str]], typer.Option(
    "--weights", metavar="PATH", help="HF checkpoint directory or one .safetensors file; repeat the flag for several .safetensors "
                      "files (no directory in a list; tokenizer.json and config.json beside the first); replaces "
                      "the target's weights")]
ChunkOpt = Annotated[Optional[int], typer.Option("--chunk", help="prefill chunk in tokens (default: the target's; "
                                                 "without one 512 clamped to the manifest's tokens max; a value above "
                                                 "that max is refused)")]
CapacityOpt = Annotated[Optional[int], typer.Option("--capacity", help="KV capacity in tokens (default: the target's; "
                                                    "4096 without one)")]
DEFAULT_PROMPT = "The capital of France is"
GpuOpt = Annotated[Optional[int], typer.Option("--gpu", help="CUDA device ordinal")]
LogOpt = Annotated[Optional[str], typer.Option("--log-level", help="debug|info|warning|error (default $KERN_LOG or info)")]


_ARGV: list[str] = []  # the command line being run (_OneLineUsageErrors), for _typed_flag


def _typed_flag(names: tuple[str, ...]) -> str:
    """The spelling of an option with several names as the command line gave it (`--steps` for `--max-tokens`),
    for a refusal that names it; the first name when it is not found."""
    given = _given_value(list(names), _ARGV)
    return given[0] if given is not None else names[0]


def _one_line(exc: BaseException) -> str:
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__


def _kern_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [RefusalError]
    try:
        from kern_runtime import KernError

        errors.append(KernError)
    except ImportError:
        pass
    try:
        from kern_manifest import ManifestError

        errors.append(ManifestError)
    except ImportError:
        pass
    return tuple(errors)


def _guarded(command: str, level: str, fn: Any) -> Any:
    """Run `fn()`; a kern error becomes one stderr line and a non-zero exit (traceback only at debug)."""
    try:
        return fn()
    except _kern_errors() as exc:
        if level == "debug":
            raise
        kind = "" if isinstance(exc, RefusalError) else f"{type(exc).__name__}: "
        print(f"kern {command}: {kind}{_one_line(exc)}", file=sys.stderr)
        raise typer.Exit(getattr(exc, "exit_code", 1)) from None
    except KeyboardInterrupt:
        print(f"kern {command}: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


def _overrides(manifest: Path | None, kernels: Path | None, weights: list[str] | None, gpu: int | None,
               capacity: int | None, chunk: int | None) -> dict[str, Any]:
    """The flags as config.resolve_config's overrides (None: not given); `weights`: every --weights given, as
    paths. Raises RefusalError for an empty --weights (taken as a str: a Path would read it as the current
    directory and load whatever checkpoint sits there)."""
    if weights is not None and any(w == "" for w in weights):
        raise RefusalError("--weights '': an empty path (an unset shell variable?): give a checkpoint directory "
                           "or a .safetensors file")
    from .hub import resolve_weights_arg

    paths = None if weights is None else [resolve_weights_arg(w) for w in weights]  # ORG/NAME: the HF cache's
    return {"manifest": manifest, "kernels": kernels, "weights": paths, "gpu": gpu, "capacity": capacity,
            "chunk": chunk}


SERVE_SEQS_MAX = 64  # the builder's batched decode: buckets 1, 2, 4, .. 64 (kern_run.models.qwen3 seqs_max)

NoPinsOpt = Annotated[bool, typer.Option("--no-pins", help="with --weights alone: build the manifest without "
                                         "cuBLASLt pins (prefill then not batch-invariant)")]


def _run_config(config: Path | None, target: str | None, overrides: dict[str, Any], no_pins: bool,
                command: str, seqs_max: int = 1, batch_invariant: bool = False) -> Any:
    """The RunConfig of `kern run` / `kern test` / `kern serve`: --weights without --manifest and --target builds (or reuses) the
    manifest of the checkpoint's config.json (kern_run.auto_manifest; `seqs_max` decode rows, `batch_invariant`:
    kern serve's), otherwise the kern.toml target with the flags over it. Raises RefusalError (--no-pins given
    with a manifest or target)."""
    if overrides["weights"] and overrides["manifest"] is None and target is None:
        from .auto_manifest import AutoRequest, auto_config

        check_numbers(overrides)  # before the device probe of the pins lookup, as resolve_config does

        return auto_config(AutoRequest(overrides["weights"], overrides["kernels"], overrides["gpu"] or 0,
                                       overrides["capacity"], overrides["chunk"], pins=not no_pins,
                                       seqs_max=seqs_max, batch_invariant=batch_invariant),
                           command=command)
    if no_pins:
        raise RefusalError("--no-pins is an option of --weights DIR alone (the manifest built from its config.json); "
                           "a --manifest or --target manifest carries its own pins")
    return resolve_config(find_toml(config), target, overrides)


# `kern run` sampling flags -> SamplingParams fields (docs/caller.md "Sampling"); None: not given
SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
                  "seed": "--seed", "repetition_penalty": "--repetition-penalty",
                  "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty",
                  "logprobs": "--logprobs", "top_logprobs": "--top-logprobs"}


def given_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags given on the command line (`flags`: field -> value; None or False: not given)."""
    return {k: v for k, v in flags.items() if v is not None and v is not False}


def run_sampling(flags: dict[str, Any], defaults: tuple[tuple[str, Any], ...], target: str | None) -> tuple[Any, str]:
    """(SamplingParams, where they came from) for `kern run`: the kern.toml target's `[targets.NAME.sampling]`
    defaults (`defaults`, already checked), each field overridden by its flag when given (`flags`: field -> value or
    None). No flag and no default: greedy. Raises SamplingError naming the flag (or the target) and the allowed
    range."""
    from .errors import SamplingError
    from .sampling import SamplingParams

    fields = dict(defaults)
    source = {k: f"kern.toml target {target!r} sampling" for k in fields}
    for key, value in given_flags(flags).items():
        fields[key] = value
        source[key] = SAMPLING_FLAGS[key]
    try:
        params = SamplingParams(**fields)
    except SamplingError as exc:
        field = next((k for k in fields if str(exc).startswith(f"sampling: {k} = ")), None)
        raise SamplingError(f"{source.get(field, 'sampling')}: {exc}") from None
    shown = [f"{source[k]} {k} = {fields[k]!r}" if not source[k].startswith("--")
             else source[k] if fields[k] is True else f"{source[k]} {fields[k]}" for k in fields]
    return params, ", ".join(shown) if shown else "sampling"


@app.command()
def run(
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help=f"prompt text (default: {DEFAULT_PROMPT!r}; "
                                                  "not with --prompts)")] = None,
    steps: Annotated[int, typer.Option("--max-tokens", "--steps", "-n", help="tokens to generate at most, per "
                                       "prompt (--steps: the older name)")] = 128,
    eager: Annotated[bool, typer.Option("--eager", help="replay decode launch by launch (no CUDA graph)")] = False,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="do not stop at EOS")] = False,
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel ranks (GPUs gpu..gpu+tp-1, manifests "
                                           "<manifest>-tp<N>-r<rank>.json), one process per GPU")] = 1,
    tp_local: Annotated[bool, typer.Option("--tp-local", help="with --tp: every rank in this one process "
                                           "(connect_local) instead of one process per GPU")] = False,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="prompts file, one per line or JSONL "
                                                    "{\"prompt\": ...}; decoded together in batches, cached "
                                                    "prefixes shared")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="sampling temperature (>= 0; 0: "
                                                         "greedy, the default)")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="nucleus sampling mass in (0, 1] (1: off)")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="keep the k most likely tokens (0: off)")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="keep tokens of at least min_p x the best "
                                                   "probability, in [0, 1] (0: off)")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="sampling seed in [0, 2^64 - 1] (default: random "
                                                "per prompt, printed on stderr)")] = None,
    repetition_penalty: Annotated[Optional[float], typer.Option("--repetition-penalty", help="> 0, 1: off; "
                                                                "over the prompt's and generated tokens")] = None,
    presence_penalty: Annotated[Optional[float], typer.Option("--presence-penalty", help="in [-2, 2], 0: off")] = None,
    frequency_penalty: Annotated[Optional[float], typer.Option("--frequency-penalty", help="in [-2, 2], 0: "
                                                               "off")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="STRING", help="stop a prompt's output "
                                                      "before this text (repeatable; never printed)")] = None,
    logprobs: Annotated[bool, typer.Option("--logprobs", help="log each generated token's log-probability on "
                                           "stderr")] = False,
    top_logprobs: Annotated[Optional[int], typer.Option("--top-logprobs", help="log the N most likely tokens of "
                                                        "each step on stderr (0..20; synchronous decode)")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="argmax decoding: drop the target's [sampling] defaults "
                                         "(not with sampling flags)")] = False,
    target: TargetOpt = None, config: ConfigOpt = None, manifest: ManifestOpt = None, kernels: KernelsOpt = None,
    weights: WeightsOpt = None, chunk: ChunkOpt = None, capacity: CapacityOpt = None, gpu: GpuOpt = None,
    no_pins: NoPinsOpt = False, log_level: LogOpt = None,
) -> None:
    """Generate from a prompt (greedy unless sampling flags or the target's sampling say otherwise); stdout carries
    only the generated text. `--weights DIR` alone (no --manifest, no --target): the manifest is built from
    DIR/config.json and cached (DIR may be a hub id ORG/NAME in the local Hugging Face cache)."""
    from .run import RunRequest, run_prompts, run_target
    from .stop_text import check_stops

    level = resolve_level(log_level)
    log = setup_logging(level)
    flags = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": seed,
             "repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty,
             "frequency_penalty": frequency_penalty, "logprobs": logprobs, "top_logprobs": top_logprobs}

    def go() -> None:
        if tp > 1 and weights and manifest is None and target is None:
            raise RefusalError(f"--tp {tp} with --weights alone: build the rank manifests with `kern manifest build "
                               f"--config CONFIG.JSON --tp {tp} --out m.json` and pass --manifest m.json")
        if prompt is not None and prompts is not None:
            raise RefusalError(f"--prompt with --prompts {prompts}: pass one or the other (the prompts file's lines "
                               "are the prompts)")
        text = DEFAULT_PROMPT if prompt is None else prompt
        if steps < 0:
            raise RefusalError(f"{_typed_flag(('--max-tokens', '--steps', '-n'))} {steps} must be >= 0")
        if tp < 1:
            raise RefusalError(f"--tp {tp} must be >= 1")
        stops = check_stops(stop or ())
        run_sampling(flags, (), None)  # the flags' own values, before the target resolves
        cfg = _run_config(config, target, _overrides(manifest, kernels, weights, gpu, capacity, chunk), no_pins,
                          "run")
        if greedy and set(given_flags(flags)) - {"logprobs", "top_logprobs"}:
            raise RefusalError("--greedy with a sampling flag: pass one or the other")
        params, where = run_sampling(flags, () if greedy else cfg.sampling, cfg.target)
        if tp > 1:
            if prompts is not None:
                raise RefusalError("--prompts with --tp > 1 is not supported: run the prompts at --tp 1")
            if not params.greedy or params.penalizes or params.logprobs or params.top_logprobs or stops:
                raise RefusalError(f"--tp {tp} decodes greedily without stop strings or logprobs: drop {where}"
                                   f"{' and --stop' if stops else ''} (--greedy drops a target's sampling defaults)")
            if tp_local:
                from .tp import run_tp

                run_tp(cfg, text, steps, eager, ignore_eos, tp, log)
            else:
                from .tp_procs import run_tp_procs

                run_tp_procs(cfg, text, steps, eager, ignore_eos, tp, level)
            return
        req = RunRequest(text, steps, eager, ignore_eos, params, stops, where)
        if prompts is not None:
            from .prefix_cache import read_prompts

            run_prompts(cfg, read_prompts(prompts), req, log)
            return
        run_target(cfg, req, log)

    _guarded("run", level, go)


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port")] = 8000,
    max_seqs: Annotated[int, typer.Option("--max-seqs", help="decode rows per step at most (capped by the "
                                          "manifest's seqs var max)")] = 64,
    host_gib: Annotated[float, typer.Option("--host-gib", help="pinned host tier for parked prefixes, GiB")] = 0.0,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="require 'Authorization: Bearer KEY'")] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", help="requests in flight at most (429 beyond)")] = 256,
    token_budget: Annotated[Optional[int], typer.Option("--token-budget", help="tokens per step, decode rows plus "
                                                        "prefill (default: chunk + max-seqs)")] = None,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", help="seconds SIGTERM waits for requests in "
                                                 "flight")] = 30.0,
    model_name: Annotated[Optional[str], typer.Option("--model-name", help="the model name requests use "
                                                      "(default: the target's)")] = None,
    eager: Annotated[bool, typer.Option("--eager", help="replay decode launch by launch (no CUDA graph)")] = False,
    invariant: Annotated[bool, typer.Option("--invariant/--no-invariant", help="run the target's serve_manifest "
                                            "(batch-invariant decode: a response equals its prompt run alone) when "
                                            "it has one; --no-invariant: its manifest")] = True,
    target: TargetOpt = None, config: ConfigOpt = None, manifest: ManifestOpt = None, kernels: KernelsOpt = None,
    weights: WeightsOpt = None, chunk: ChunkOpt = None, capacity: CapacityOpt = None, gpu: GpuOpt = None,
    no_pins: NoPinsOpt = False, log_level: LogOpt = None,
) -> None:
    """Serve a target over an OpenAI-compatible HTTP API (docs/serve.md); `--weights DIR` alone: the manifest
    built from DIR/config.json, as for kern run."""
    from .serve.server import ServeOptions, serve_target

    level = resolve_level(log_level)
    log = setup_logging(level)

    def go() -> None:
        opts = ServeOptions(host, port, max_seqs, host_gib, api_key, max_queue, token_budget, drain_timeout,
                            model_name, eager, invariant)
        opts.check()  # before the target resolves and anything probes the device
        # --weights alone: a manifest of min(--max-seqs, 64) decode rows, batch-invariant unless --no-invariant or
        # --no-pins (docs/serve.md "Which manifest")
        cfg = _run_config(config, target, _overrides(manifest, kernels, weights, gpu, capacity, chunk), no_pins,
                          "serve", seqs_max=min(max_seqs, SERVE_SEQS_MAX), batch_invariant=invariant and not no_pins)
        serve_target(cfg, opts, log)

    _guarded("serve", level, go)


@app.command("test")
def test_cmd(
    against: Annotated[str, typer.Option("--against", help="eager | chunk1 | transformers | path to manifest B")] = "eager",
    prompts: Annotated[int, typer.Option("--prompts", help="number of sampled prompts")] = 4,
    steps: Annotated[int, typer.Option("--steps", "-n", help="greedy steps per prompt")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="seed of the random-token prompts (>= 0)")] = 0,
    margin_tol: Annotated[Optional[float], typer.Option("--margin-tol", help="top-2 margin under which a top-1 "
                                                        "disagreement is not a mismatch")] = None,
    target: TargetOpt = None, config: ConfigOpt = None, manifest: ManifestOpt = None, kernels: KernelsOpt = None,
    weights: WeightsOpt = None, chunk: ChunkOpt = None, capacity: CapacityOpt = None, gpu: GpuOpt = None,
    no_pins: NoPinsOpt = False, log_level: LogOpt = None,
) -> None:
    """A/B: the target against eager decode, chunk-1 prefill, another manifest or transformers (`--weights DIR`
    alone: the manifest built from DIR/config.json, as for kern run)."""
    from .abtest import AbRequest, run_ab

    level = resolve_level(log_level)
    log = setup_logging(level)

    def go() -> int:
        cfg = _run_config(config, target, _overrides(manifest, kernels, weights, gpu, capacity, chunk), no_pins,
                          "test")
        comparisons, report = run_ab(cfg, AbRequest(against, prompts, steps, seed, margin_tol=margin_tol), log)
        print(report)
        return sum(len(c.hard_mismatches) for c in comparisons)

    hard = _guarded("test", level, go)
    if hard:
        print(f"kern test: {hard} top-1 mismatch(es) outside the margin tolerance", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def inspect(
    manifest: Annotated[Path, typer.Argument(help="manifest JSON")],
    log_level: LogOpt = None,
) -> None:
    """Print what a manifest declares (no GPU needed); any kern manifest, verified first."""
    from .preflight import load_verified
    from .summary import manifest_lines

    level = resolve_level(log_level)

    def go() -> None:
        for line in manifest_lines(load_verified(manifest)):  # the computed digest, declared or not
            print(line)

    _guarded("inspect", level, go)


@manifest_app.command("check")
def manifest_check(
    manifest: Annotated[Path, typer.Argument(help="manifest JSON")],
    log_level: LogOpt = None,
) -> None:
    """Parse and verify a manifest: the summary, or every fault with its JSON path (exit 1). The same
    command as `kern-manifest check` (kern_manifest.cli)."""
    from kern_manifest.cli import check  # the `kern-manifest check` command itself (kern_manifest.cli.__all__)

    resolve_level(log_level)
    code = check(str(manifest), sys.stdout, sys.stderr)
    if code:
        raise typer.Exit(code)


@manifest_app.command("build")
def manifest_build(
    out: Annotated[Path, typer.Option("--out", help="manifest to write, its directory made when missing (with "
                                      "--tp N: the rank files <stem>-tp<N>-r<rank>.json beside it)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="a Qwen3 or Llama 3 config.json")] = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="a known shape instead: qwen3-0.6b, -1.7b, -4b, "
                                                 "-8b, -14b, -32b, tiny, llama3.2-1b, llama3.2-3b or "
                                                 "llama3.1-8b")] = None,
    kernels: Annotated[Optional[Path], typer.Option("--kernels", help="kernels directory (its kernels.json: the "
                                                    "ABI), or the kernels.json itself (default: kern_run.kernels_dir(), "
                                                    "the wheel's or the checkout's)")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="manifest name (default: the shape, or the config's "
                                                "directory name)")] = None,
    chunk_max: Annotated[int, typer.Option("--chunk-max", help="tokens var max (largest prefill chunk)")] = 512,
    seqs_max: Annotated[int, typer.Option("--seqs-max", help="seqs var max: rows of a decode step (gemv decode: "
                                          "2..64 need --gemv v2)")] = 1,
    batch_proj: Annotated[str, typer.Option("--batch-proj", help="with --seqs-max > 1: the projections of 2..64-row "
                                            "steps: cublaslt (default), rows (multi-row GEMVs for 2..8 rows, then "
                                            "cublaslt) or mma (kernels-src/gemv_mma.cu)")] = "cublaslt",
    max_context: Annotated[Optional[int], typer.Option("--max-context", help="positions per sequence (default "
                                                       "min(40960, max_position_embeddings); tiny 4096)")] = None,
    decode: Annotated[Optional[str], typer.Option("--decode", help="decode projections: gemv (M = 1 GEMVs, fused "
                                                  "norms and residuals; default, also with --tp) or gemm "
                                                  "(cuBLASLt)")] = None,
    m1_gemv: Annotated[bool, typer.Option("--m1-gemv", help="with --decode gemm: the decode projections on "
                                          "kern_gemv_rows (M = 1)")] = False,
    gemv: Annotated[str, typer.Option("--gemv", help="decode GEMV wiring: v1 warp-per-row, v2 rows family with the "
                                      "SwiGLU epilogue")] = "v1",
    decode_attn: Annotated[str, typer.Option("--decode-attn", help="decode attention: wide, early, split, "
                                             "stream, gqa or gqa-fused")] = "wide",
    decode_attn_batch: Annotated[str, typer.Option("--decode-attn-batch", help="with --seqs-max > 1: the decode "
                                                   "attention of 2..64-row steps (stream, gqa, gqa-fused, wide "
                                                   "or early; '' = --decode-attn's)")] = "stream",
    prefill_attn: Annotated[str, typer.Option("--prefill-attn", help="prefill attention: auto (wg where the head_dim "
                                              "allows, else r32), wg, r32 or r16")] = "auto",
    prefill_rope: Annotated[str, typer.Option("--prefill-rope", help="q/k norm + rope for chunks of 2+ tokens: warp "
                                              "or block")] = "warp",
    carveout: Annotated[int, typer.Option("--carveout", help="preferred shared-memory carveout, percent 0..100 "
                                          "(-1: none, the driver's choice)")] = 100,
    decode_splits: Annotated[int, typer.Option("--decode-splits", help="decode attention splits (0: auto)")] = 0,
    decode_split_tokens: Annotated[int, typer.Option("--decode-split-tokens", help="minimum context tokens per "
                                                     "decode split (a multiple of the page size)")] = 64,
    sms: Annotated[int, typer.Option("--sms", help="SM count of the target GPU (132: H200)")] = 132,
    gemv_threads_per_sm: Annotated[int, typer.Option("--gemv-threads-per-sm", help="decode GEMV grids fill at "
                                                     "most this many threads per SM")] = 1024,
    no_pdl: Annotated[bool, typer.Option("--no-pdl", help="no programmatic dependent launch in decode")] = False,
    no_pdl_small: Annotated[bool, typer.Option("--no-pdl-small", help="PDL on the GEMVs, the skinny GEMM and "
                                               "decode attention only (not on the embedding, RMSNorms, SiLU-mul, "
                                               "rope, argmax and step advance)")] = False,
    algos: Annotated[Optional[Path], typer.Option("--algos", help="cuBLASLt pins of tools/pick_algos.py "
                                                  "(batch-invariant prefill GEMMs)")] = None,
    sampler: Annotated[str, typer.Option("--sampler", help="the decode step's end: gpu (per-row sampling in the "
                                         "graph; next_token packs token and logprob) or argmax (greedy only, "
                                         "plain token ids)")] = "gpu",
    hist_cap: Annotated[int, typer.Option("--hist-cap", help="with --sampler gpu: history slots (distinct previous "
                                          "tokens) per row for the penalties")] = 1024,
    batch_invariant: Annotated[bool, typer.Option("--batch-invariant", help="the same decode launches at every row "
                                                  "count, 1 included: pinned cuBLASLt projections (--algos; --decode "
                                                  "gemm), or the small-M MMA ones with --decode gemv --gemv v2 "
                                                  "--batch-proj mma; --decode-attn-batch's attention for every "
                                                  "row")] = False,
    invariant_proj: Annotated[str, typer.Option("--invariant-proj", help="with --batch-invariant --decode gemm: the "
                                                "layer projections on cublaslt (the invariant pins; default) or "
                                                "skinny (kern_gemm_skinny, the SiLU-mul fused)")] = "cublaslt",
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel ranks: write one manifest per rank")] = 1,
    allreduce_oneshot_bytes: Annotated[int, typer.Option("--allreduce-oneshot-bytes", help="with --tp: all-reduces "
                                                         "of messages up to this size run kern's one-shot kernel, "
                                                         "larger ones NCCL (0: NCCL only)")] = 256 * 1024,
    allreduce_timeout_ms: Annotated[int, typer.Option("--allreduce-timeout-ms", help="with --tp: how long a one-shot "
                                                      "all-reduce waits for a peer")] = 1000,
    tp_lm_head: Annotated[str, typer.Option("--tp-lm-head", help="with --tp: vocab (each rank computes its slice "
                                            "of the vocabulary's logits, then a one-shot all-gather; default) or "
                                            "replicated (every rank reads the whole lm_head)")] = "vocab",
    no_verify: Annotated[bool, typer.Option("--no-verify", help="skip verification with kern_manifest")] = False,
    log_level: LogOpt = None,
) -> None:
    """Build a Qwen3 or Llama 3 manifest from a config.json (or a known --shape) and the kernels' ABI (docs/manifest.md).
    Refusals name the file, config field or flag; nothing is written then."""
    from .models.qwen3 import BuildRequest, build

    options = {"chunk_max": chunk_max, "seqs_max": seqs_max, "batch_proj": batch_proj, "decode": decode, "m1_gemv": m1_gemv, "gemv": gemv, "decode_attn": decode_attn, "decode_attn_batch": decode_attn_batch,
               "prefill_attn": prefill_attn, "prefill_rope": prefill_rope,
               "carveout": None if carveout == -1 else carveout, "decode_splits": decode_splits,
               "split_tokens": decode_split_tokens, "sms": sms, "gemv_threads_per_sm": gemv_threads_per_sm,
               "pdl": not no_pdl, "pdl_small": not no_pdl_small, "sampler": sampler, "hist_cap": hist_cap,
               "batch_invariant": batch_invariant, "invariant_proj": invariant_proj,
               "allreduce_oneshot_bytes": allreduce_oneshot_bytes,
               "allreduce_timeout_ms": allreduce_timeout_ms, "tp_lm_head": tp_lm_head}

    def go() -> list[str]:
        from .package_data import kernels_dir

        return build(BuildRequest(out=out, config=config, shape=shape, name=name, max_context=max_context, tp=tp,
                                  kernels=kernels if kernels is not None else kernels_dir(), algos=algos,
                                  verify=not no_verify, options=options))

    for line in _guarded("manifest build", resolve_level(log_level), go):
        print(f"kern manifest build: {line}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def kernels(ctx: typer.Context) -> None:
    """Build the cubins and kernels/kernels.json: runs tools/build_kernels.py with the given arguments
    (--help: its options). Building kernels needs the kern checkout (kernels-src/ and tools/); an installed
    kern-run without one says so in one line (exit 2)."""
    toml = find_toml()
    root = toml.parent if toml else Path.cwd()
    script = root / "tools" / "build_kernels.py"
    if not script.is_file():
        print(f"kern kernels: building kernels needs the kern checkout (kernels-src/ and tools/build_kernels.py); "
              f"{script} not found: run it inside the kern repository", file=sys.stderr)
        raise typer.Exit(2)
    # as a module from the checkout's root: `tools.*` resolves there without the workspace's editable install
    raise typer.Exit(subprocess.call([sys.executable, "-m", "tools.build_kernels", *ctx.args], cwd=root))


@harvest_app.command("capture")
def harvest_capture(
    weights: Annotated[Path, typer.Option("--weights", help="Qwen3 checkpoint directory")],
    out: Annotated[Path, typer.Option("--out", help="capture directory to write (must not exist)")],
    tokens: Annotated[Optional[list[int]], typer.Option("--tokens", help="token count of a recorded run; repeat "
                                                        "(default 1 and 2)")] = None,
    context: Annotated[int, typer.Option("--context", help="KV cache positions of the step")] = 256,
    warmup: Annotated[int, typer.Option("--warmup", help="unrecorded steps per token count first")] = 2,
    dynamic: Annotated[str, typer.Option("--dynamic", help="token dim: unbacked, backed or static")] = "unbacked",
    compile_scope: Annotated[str, typer.Option("--compile-scope", help="one compiled graph per decoder layer "
                                               "(layer: one compiled layer serves them all) or for the whole step "
                                               "(step)")] = "layer",
    autotune_tokens: Annotated[Optional[int], typer.Option("--autotune-tokens", help="rows the GEMMs are "
                                                          "autotuned for (default: inductor's hint for an unbacked "
                                                          "token count, 8192; 1 tunes them for decode)")] = None,
    gpu: Annotated[int, typer.Option("--gpu", help="CUDA device ordinal")] = 0,
    log_level: LogOpt = None,
) -> None:
    """Run the model step under torch.compile with CUPTI recording it (GPU, torch, cupti-python)."""
    from .harvest.command import capture_lines

    go = lambda: capture_lines(weights, out, tokens or [1, 2], context, warmup, dynamic, gpu,  # noqa: E731
                               compile_scope, autotune_tokens)
    for line in _guarded("harvest capture", resolve_level(log_level), go):
        print(line)


@harvest_app.command("mine")
def harvest_mine(capture: Annotated[Path, typer.Argument(help="capture directory")], log_level: LogOpt = None) -> None:
    """Classify every launch parameter of a capture and fit what varies; print the report (no GPU)."""
    from .harvest.command import mine_lines

    for line in _guarded("harvest mine", resolve_level(log_level), lambda: mine_lines(capture)):
        print(line)


@harvest_app.command("generate")
def harvest_generate(
    capture: Annotated[Path, typer.Argument(help="capture directory")],
    out: Annotated[Path, typer.Option("--out", help="directory to write: manifest.json and kernels/")],
    name: Annotated[Optional[str], typer.Option("--name", help="manifest name (default: the captured model's)")] = None,
    log_level: LogOpt = None,
) -> None:
    """Write the harvested manifest and its pinned cubins (no GPU); nothing is written on a refusal."""
    from .harvest.command import generate_lines

    for line in _guarded("harvest generate", resolve_level(log_level), lambda: generate_lines(capture, out, name)):
        print(line)


def main() -> None:  # `python -m kern_run.cli`
    app()


if __name__ == "__main__":
    main()
