"""The `kern` command line: thin wrappers that parse options into a config and call one function.

    kern run [--target T] [--prompt P] [--steps N] [--chunk C] [--capacity K] [--eager] [--gpu G] ...
             [--weights DIR_OR_FILE | --weights A.safetensors --weights B.safetensors ...]
    kern test [--against eager|chunk1|transformers|MANIFEST] [--prompts N] [--steps N]
    kern inspect MANIFEST
    kern manifest check MANIFEST
    kern kernels [ARGS...]          (tools/build_kernels.py)
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

from .config import find_toml, resolve_config
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
        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        argv = list(sys.argv[1:] if args is None else args)
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
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=_OneLineUsageErrors, add_completion=False, no_args_is_help=True,
                  help="kern: run LLM inference from a manifest.")
manifest_app = typer.Typer(no_args_is_help=True, help="Manifest tools.")
app.add_typer(manifest_app, name="manifest")


def package_versions() -> str:
    """`kern-run X, kern-runtime Y, kern-manifest Z, kern-pool W` from the installed distributions' metadata
    ("not installed" for one on PYTHONPATH only, as on the GPU machine's tools/gpu-env.sh)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("kern-run", "kern-runtime", "kern-manifest", "kern-pool"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
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
GpuOpt = Annotated[Optional[int], typer.Option("--gpu", help="CUDA device ordinal")]
LogOpt = Annotated[Optional[str], typer.Option("--log-level", help="debug|info|warning|error (default $KERN_LOG or info)")]


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
    paths = None if weights is None else [Path(w) for w in weights]
    return {"manifest": manifest, "kernels": kernels, "weights": paths, "gpu": gpu, "capacity": capacity,
            "chunk": chunk}


@app.command()
def run(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="prompt text")] = "The capital of France is",
    steps: Annotated[int, typer.Option("--steps", "-n", help="tokens to generate at most")] = 128,
    eager: Annotated[bool, typer.Option("--eager", help="replay decode launch by launch (no CUDA graph)")] = False,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="do not stop at EOS")] = False,
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel ranks (GPUs gpu..gpu+tp-1, manifests "
                                           "<manifest>-tp<N>-r<rank>.json)")] = 1,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="prompts file, one per line or JSONL "
                                                    "{\"prompt\": ...}; cached prefixes are shared")] = None,
    target: TargetOpt = None, config: ConfigOpt = None, manifest: ManifestOpt = None, kernels: KernelsOpt = None,
    weights: WeightsOpt = None, chunk: ChunkOpt = None, capacity: CapacityOpt = None, gpu: GpuOpt = None,
    log_level: LogOpt = None,
) -> None:
    """Generate greedily from a prompt; stdout carries only the generated text."""
    from .run import RunRequest, run_target

    level = resolve_level(log_level)
    log = setup_logging(level)

    def go() -> None:
        cfg = resolve_config(find_toml(config), target, _overrides(manifest, kernels, weights, gpu, capacity, chunk))
        if steps < 0:
            raise RefusalError(f"--steps {steps} must be >= 0")
        if tp < 1:
            raise RefusalError(f"--tp {tp} must be >= 1")
        if tp > 1:
            if prompts is not None:
                raise RefusalError("--prompts with --tp > 1 is not supported: run the prompts at --tp 1")
            from .tp import run_tp

            run_tp(cfg, prompt, steps, eager, ignore_eos, tp, log)
            return
        if prompts is not None:
            from .prefix_cache import read_prompts, run_prompts

            run_prompts(cfg, read_prompts(prompts), RunRequest(prompt, steps, eager, ignore_eos), log)
            return
        run_target(cfg, RunRequest(prompt, steps, eager, ignore_eos), log)

    _guarded("run", level, go)


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
    log_level: LogOpt = None,
) -> None:
    """A/B: the target against eager decode, chunk-1 prefill, another manifest or transformers."""
    from .abtest import AbRequest, run_ab

    level = resolve_level(log_level)
    log = setup_logging(level)

    def go() -> int:
        cfg = resolve_config(find_toml(config), target, _overrides(manifest, kernels, weights, gpu, capacity, chunk))
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
        raw, parsed = load_verified(manifest)
        raw = {**raw, "digest": parsed.digest}  # the computed digest, declared or not
        for line in manifest_lines(raw, parsed):
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def kernels(ctx: typer.Context) -> None:
    """Build the cubins and kernels/kernels.json: runs tools/build_kernels.py with the given arguments
    (--help: its options)."""
    toml = find_toml()
    root = toml.parent if toml else Path.cwd()
    script = root / "tools" / "build_kernels.py"
    if not script.is_file():
        print(f"kern kernels: {script} not found: run from the kern repository", file=sys.stderr)
        raise typer.Exit(2)
    raise typer.Exit(subprocess.call([sys.executable, str(script), *ctx.args], cwd=root))


def main() -> None:  # `python -m kern_run.cli`
    app()


if __name__ == "__main__":
    main()
