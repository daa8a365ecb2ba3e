"""`kern run --tp N`: N rank processes, one per GPU (docs/runtime.md "One process per GPU").

The parent (`run_tp_procs`) runs every host-side check once (rank manifests, checkpoint, tokenizer, prompt), writes
the request into a private directory and starts the ranks with `tp_rendezvous.spawn_ranks` (`python -m
kern_run.tp_procs REQUEST`); a rank that exits non-zero or dies fails the group at once, every other rank is
terminated, and the error names the rank (the failing rank's own message, from the verdict file it left, when it
could write one). Each rank (`rank_main`):

1. loads its manifest `<manifest>-tp<N>-r<rank>.json` on GPU gpu + rank (rank 0 first opens the step stream's
   listening socket);
2. joins the group (`join_group`): `offer(portable=True)` (fabric handles, else POSIX file descriptors),
   `exchange_fds` over the rendezvous socket (descriptors by SCM_RIGHTS), `Offer.from_bytes` of every peer's
   offer (a bad one names the rank that sent it), `connect` (family digests checked, peers imported, NCCL
   joined); every descriptor is closed once imported;
3. rank 0 drives: a Generator over `tp_steps.StreamingRuntime` (the pipelined decode loop; each step's
   inputs and programs streamed to the followers first), text on stdout; the followers apply the stream
   (`tp_steps.follow`) until rank 0 closes it.

Bounds: `timeout_s` for the rendezvous, the step stream's joining and its close; the one-shot all-reduce's own
wait bound (its manifest's timeout) for a peer lost mid-step; the launcher for a rank that exits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Mapping

from .config import RunConfig, runtime_weights
from .errors import RefusalError
from .files import write_files
from .generate import GenerateResult
from .preflight import probe_device, read_manifest, resolve_chunk
from .tp import generate_tp, rank_manifest, tp_host_checks
from .tp_rendezvous import (GroupFailedError, RankEnv, RendezvousError, exchange_fds, private_dir, rank_env,
                            spawn_ranks)
from .tp_steps import STEPS_SOCKET, StepRankError, StepSender, StreamingRuntime, connect_steps, follow

GROUP = "tp"
TIMEOUT_S = 300.0  # rendezvous, step-stream join and close: ranks load their weights before the rendezvous
GROUP_TIMEOUT_S = 7 * 24 * 3600.0  # the launcher's bound on a whole run (failures are caught by exits, not this)
REQUEST_FORMAT = "kern-tp-request/1"


class TpGroupError(RefusalError):
    """The group failed; `rank` is the rank the failure names (the rank that died, or the one it waited for)."""

    exit_code = 1

    def __init__(self, message: str, *, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


# ---------------------------------------------------------------- the parent


def request_json(cfg: RunConfig, prompt: str, steps: int, eager: bool, ignore_eos: bool, tp: int, log_level: str,
                 timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """What every rank reads: the run's config and arguments (JSON-able)."""
    weights = [str(w) for w in cfg.weights] if isinstance(cfg.weights, (list, tuple)) else str(cfg.weights)
    return {"format": REQUEST_FORMAT, "manifest": str(cfg.manifest), "kernels": str(cfg.kernels), "weights": weights,
            "gpu": cfg.gpu, "capacity_tokens": cfg.capacity_tokens, "chunk": cfg.chunk, "prompt": prompt,
            "steps": steps, "eager": eager, "ignore_eos": ignore_eos, "tp": tp, "log_level": log_level,
            "timeout_s": timeout_s}


def config_of(req: dict[str, Any]) -> RunConfig:
    weights = req["weights"]
    return RunConfig(Path(req["manifest"]), Path(req["kernels"]),
                     tuple(Path(w) for w in weights) if isinstance(weights, list) else Path(weights), gpu=req["gpu"],
                     capacity_tokens=req["capacity_tokens"], chunk=req["chunk"])


def run_tp_procs(cfg: RunConfig, prompt: str, steps: int, eager: bool, ignore_eos: bool, tp: int, log_level: str,
                 *, timeout_s: float = TIMEOUT_S) -> None:
    """`kern run --tp N`: the host checks, then N rank processes (rank 0's stdout is the generated text). Raises
    RefusalError for the checks, TpGroupError naming the rank when the group fails."""
    tp_host_checks(cfg, prompt, tp)  # every refusal that needs no GPU, before any process starts
    for r in range(tp):  # every rank's GPU exists (NoDeviceError naming the first missing), before any rank starts
        probe_device(cfg.gpu + r)
    launch(request_json(cfg, prompt, steps, eager, ignore_eos, tp, log_level, timeout_s))


def launch(request: dict[str, Any]) -> None:
    """Start request["tp"] rank processes on `request` (request_json's, maybe with "jobs") and wait for them.
    Raises TpGroupError naming the rank when the group fails."""
    with private_dir("kern-tp-run-") as work:
        path = work / "request.json"
        path.write_text(json.dumps(request))
        try:
            spawn_ranks(int(request["tp"]), [sys.executable, "-m", "kern_run.tp_procs", str(path)],
                        timeout_s=GROUP_TIMEOUT_S)
        except GroupFailedError as exc:
            raise group_error(exc, work) from None


def run_jobs(cfg: RunConfig, tp: int, jobs: list[dict[str, Any]], result_dir: Path, log_level: str = "info",
             timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Run `jobs` on rank 0 of a TP group of processes (tools/tp_parity.py --procs, bench/decode.py --tp): each
    job a dict with "kind" and "name":

        {"kind": "generate", "name", "prompt_ids", "steps", "eager": False, "lookahead": 4}
            -> {"tokens", "token_s" (host arrival times, s), "prefill_s", "pipelined"}
        {"kind": "teacher_forced", "name", "ids", "prefill_tokens"}
            -> {"logits": f32[m, vocab] (also saved as <name>.npy in result_dir), "argmax"}

    Returns {"jobs": {name: result}, "weights": (bytes, seconds) of rank 0's load}. No host checks: the
    caller made the manifests and checkpoint. Raises TpGroupError naming the failing rank."""
    import numpy as np

    result_dir.mkdir(parents=True, exist_ok=True)
    request = request_json(cfg, "", 0, False, True, tp, log_level, timeout_s)
    request.update(jobs=jobs, result_dir=str(result_dir))
    launch(request)
    out = json.loads((result_dir / "result.json").read_text())
    for job in jobs:
        if job["kind"] == "teacher_forced":
            out["jobs"][job["name"]]["logits"] = np.load(result_dir / f"{job['name']}.npy")
    return out


def group_error(exc: GroupFailedError, work: Path) -> TpGroupError:
    """The launcher's error with the failing rank's own verdict (rank<r>.error in `work`), when it left one: what it
    said and which rank that names (the one it waited for, or whose offer was bad)."""
    verdict = _verdict(work / f"rank{exc.rank}.error")
    if verdict is None:
        return TpGroupError(f"tp group failed: {exc}", rank=exc.rank)
    named = verdict.get("names")
    named = named if type(named) is int and named >= 0 else exc.rank
    return TpGroupError(f"tp group failed: {exc}: {str(verdict.get('message'))[:2000]}", rank=named)


def _verdict(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text()[:100_000])
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


# ---------------------------------------------------------------- a rank


def join_group(rt: Any, me: RankEnv, timeout_s: float) -> None:
    """Exchange portable offers with every rank and connect. Raises the rendezvous' errors (naming the rank that
    did not arrive, died or sent garbage), TpGroupError naming a rank whose offer does not parse or whose manifest
    family differs from rank 0's (every rank names the same one), and connect's ApiError. Every descriptor is
    closed on return."""
    from kern_runtime import ApiError, Offer

    offer = rt.offer(portable=True)
    try:
        blobs, fds = exchange_fds(me.rank, me.world, offer.to_bytes(), offer.fds(), me.where, timeout_s)
    finally:
        offer.close_fds()
    try:
        offers = []
        for r in range(me.world):  # this rank's own too: every rank judges the same bytes
            try:
                offers.append(Offer.from_bytes(blobs[r], fds[r]))
            except ApiError as exc:
                raise TpGroupError(f"rank {me.rank}: rank {r}'s offer: {exc}", rank=r) from None
        for r, o in enumerate(offers):
            if o.family_digest != offers[0].family_digest:
                raise TpGroupError(f"rank {me.rank}: rank {r}'s manifest (family digest {o.family_digest[:12]}) "
                                   f"differs from rank 0's ({offers[0].family_digest[:12]}): every rank loads the "
                                   "rank manifests of one `kern manifest build --tp N`", rank=r)
        rt.connect({GROUP: offers})
    finally:
        for r, got in enumerate(fds):
            for fd in got if r != me.rank else ():  # this rank's own were closed with its offer
                try:
                    os.close(fd)
                except OSError:
                    pass


def status_buffer(manifest: Any) -> str | None:
    """The status buffer of a rank manifest's one-shot collectives (a kern_manifest.Manifest;
    meta.tp.allreduce.status, else meta.tp.lm_head.status: the vocabulary-parallel lm_head's all-gather, which
    also goes one-shot when every all-reduce is NCCL's; both name `ar_status`), or None."""
    tp = (manifest.meta or {}).get("tp")
    for key in ("allreduce", "lm_head"):
        status = ((tp.get(key) if isinstance(tp, Mapping) else None) or {}).get("status")
        if isinstance(status, str) and status in manifest.buffers:
            return status
    return None


def load_rank(cfg: RunConfig, me: RankEnv, log: Any) -> tuple[Any, Any, str | None]:
    """(runtime, facts, status buffer) of this rank: its manifest loaded on GPU cfg.gpu + rank, the status word
    zeroed."""
    from kern_runtime import Capacity, Runtime, SafetensorsTensors

    facts = read_manifest(rank_manifest(Path(cfg.manifest), me.world, me.rank))
    probe_device(cfg.gpu + me.rank)
    tensors = SafetensorsTensors.open(runtime_weights(cfg.weights))
    rt = Runtime.load(facts.manifest, str(cfg.kernels), tensors, gpu=cfg.gpu + me.rank,
                      capacity=Capacity(tokens=cfg.capacity_tokens, seqs=1), ranks={GROUP: me.rank})
    status = status_buffer(facts.manifest)
    if status is not None:
        rt.host_array(status)[:] = 0
    nbytes, secs = rt.weight_load_stats
    log.info(f"rank {me.rank}: {nbytes / 1e9:.2f} GB of weights on GPU {cfg.gpu + me.rank} in {secs:.2f} s "
             f"({nbytes / 1e9 / max(secs, 1e-9):.1f} GB/s)")
    return rt, facts, status


def run_rank_jobs(gen: Any, req: dict[str, Any], chunk: int) -> None:
    """Rank 0's `run_jobs`: every job on the group's Generator; result.json (and each logits .npy) in
    req["result_dir"]."""
    import numpy as np

    from .generate import GenerateOptions

    out_dir = Path(req["result_dir"])
    results: dict[str, Any] = {}
    for job in req["jobs"]:
        name = str(job["name"])
        if job["kind"] == "generate":
            opts = GenerateOptions(int(job["steps"]), chunk, bool(job.get("eager", False)), stop_at_eos=False,
                                   lookahead=int(job.get("lookahead", 4)))
            r = gen.generate([int(t) for t in job["prompt_ids"]], opts)
            results[name] = {"tokens": r.tokens, "token_s": r.timings.token_s, "prefill_s": r.timings.prefill_s,
                             "pipelined": r.timings.pipelined}
        elif job["kind"] == "teacher_forced":
            logits, argmax = gen.teacher_forced([int(t) for t in job["ids"]], int(job["prefill_tokens"]), chunk)
            np.save(out_dir / f"{name}.npy", logits)
            results[name] = {"argmax": argmax.tolist()}
        else:
            raise RefusalError(f"tp job {name!r}: unknown kind {job['kind']!r} (generate, teacher_forced)")
    stats = gen.rt.weight_load_stats
    (out_dir / "result.json").write_text(json.dumps({"jobs": results, "weights": list(stats)}))


def drive(me: RankEnv, req: dict[str, Any], log: Any) -> GenerateResult | None:
    """Rank 0: load, join, accept the followers' step streams, generate (text on stdout) or run the request's jobs
    (run_jobs), close."""
    from .generate import Generator
    from .text import checked_prompt, load_codec

    cfg = config_of(req)
    timeout_s = float(req["timeout_s"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(me.where.parent / STEPS_SOCKET))
    listener.listen(me.world)
    try:
        rt, facts, status = load_rank(cfg, me, log)
        try:
            join_group(rt, me, timeout_s)
            sender = StepSender.accept(listener, me.world, timeout_s)
        except BaseException:
            rt.close()
            raise
    finally:
        listener.close()
    srt = StreamingRuntime(rt, sender, status)
    codec = load_codec(cfg.weights)
    gen = Generator(srt, facts, codec.eos_ids, steps=srt)
    try:
        if req.get("jobs"):
            run_rank_jobs(gen, req, resolve_chunk(cfg.chunk, facts))
            result = None
        else:
            result = generate_tp(gen, codec, checked_prompt(codec, req["prompt"]), resolve_chunk(cfg.chunk, facts),
                                 int(req["steps"]), bool(req["eager"]), bool(req["ignore_eos"]), me.world, log,
                                 sys.stdout)
    except BaseException:
        try:
            gen.close()
        except StepRankError:
            pass  # the first failure is the one to report
        raise
    gen.close()
    return result


def serve(me: RankEnv, req: dict[str, Any], log: Any) -> int:
    """Ranks 1..N-1: load, join, follow rank 0's step stream until it closes; the frames applied."""
    cfg = config_of(req)
    timeout_s = float(req["timeout_s"])
    rt, _, status = load_rank(cfg, me, log)
    try:
        join_group(rt, me, timeout_s)
        conn = connect_steps(me.where.parent / STEPS_SOCKET, me.rank, timeout_s)
        frames = follow(rt, conn, me.rank, status)
    finally:
        rt.close()
    log.info(f"rank {me.rank}: followed {frames} steps")
    return frames


def report_failure(exc: BaseException, me: RankEnv, directory: Path) -> str:
    """Write `directory/rank<r>.error` (JSON: this rank, the rank the failure names, the message; best effort;
    whole or not at all, renamed into place, since the launcher may terminate this rank while it writes and then
    reads the file) and return the one-line message this rank prints."""
    named = exc.rank if isinstance(exc, (RendezvousError, StepRankError, TpGroupError)) else None
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    kind = "" if isinstance(exc, RefusalError) else f"{type(exc).__name__}: "
    verdict = {"rank": me.rank, "names": named if type(named) is int else me.rank, "message": kind + message}
    try:
        write_files({directory / f"rank{me.rank}.error": json.dumps(verdict)})
    except OSError:
        pass
    where = "" if message.startswith(f"rank {me.rank}: ") else f"rank {me.rank}: "
    return f"kern run: {where}{kind}{message}"


def rank_main(request: Path) -> int:
    """One rank process (KERN_TP_* set by spawn_ranks): drive or serve; 0 on success. On a kern error writes
    `rank<r>.error` beside the request (report_failure) and one line on stderr, returns 1."""
    from kern_runtime import KernError

    from .log import setup_logging

    me = rank_env()
    req = json.loads(request.read_text())
    if not isinstance(req, dict) or req.get("format") != REQUEST_FORMAT:
        print(f"kern run: rank {me.rank}: {request} is not a {REQUEST_FORMAT} request", file=sys.stderr)
        return 2
    log = setup_logging(str(req.get("log_level", "info")))
    try:
        if me.rank == 0:
            drive(me, req, log)
        else:
            serve(me, req, log)
    except (KernError, RefusalError, OSError) as exc:
        print(report_failure(exc, me, request.parent), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kern_run.tp_procs REQUEST.json (started by `kern run --tp N`)", file=sys.stderr)
        return 2
    return rank_main(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
