"""`kern run --tp N` as N rank processes (kern_run.tp_procs, kern_run.tp_steps), with fake ranks (tp_procs_worker.py:
the real join_group, rendezvous and step stream over a fake runtime, started by spawn_ranks as kern run starts its
ranks).

Checked: every follower applies exactly rank 0's writes (dtypes, shapes, values) and issues (programs, vars,
eager) in order; every rank maps its peers' memory through the descriptors that travelled (their bytes read
back); no descriptor leaks. Failures, each naming the rank and bounded in time: a follower that dies mid-stream,
a rank that never reaches the rendezvous, an offer that is garbage, an offer of another manifest family, a
follower whose runtime refuses a step, an all-reduce whose wait gave up (its status word). The parent's error
(group_error) carries the failing rank's own verdict. Also: the step stream's frames refused when malformed, and
the CLI wiring of `--tp` / `--tp-local`.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from kern_run.tp_procs import TpGroupError, config_of, group_error, request_json, status_buffer
from kern_run.tp_rendezvous import GroupFailedError, spawn_ranks
from kern_run.tp_steps import (AllreduceTimeoutError, StepRankError, StepSender, recv_frame, send_frame,
                               status_error)

WORKER = str(Path(__file__).with_name("tp_procs_worker.py"))


def run_group(tmp_path: Path, mode: str, world: int, timeout_s: float = 20.0) -> GroupFailedError | None:
    try:
        spawn_ranks(world, [sys.executable, WORKER, mode, str(tmp_path), str(timeout_s)], timeout_s=120,
                    term_grace_s=1)
    except GroupFailedError as exc:
        return exc
    return None


@pytest.mark.parametrize("world", [2, 3, 4])
def test_followers_apply_rank_zeros_stream(tmp_path: Path, world: int) -> None:
    assert run_group(tmp_path, "ok", world) is None
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    lead = logs[0]["applied"]
    assert lead[0] == ["write", "token_ids", "int32", [5], [0, 1, 2, 3, 4]]
    assert lead[1] == ["write", "block_table", "int32", [2, 6], np.arange(12).reshape(2, 6).tolist()]
    assert lead[2] == ["issue", "prefill", {"tokens": 5, "seqs": 1}, False]
    assert ["issue", "decode", {"tokens": 1, "seqs": 1}, True] in lead
    assert lead[-1] == ["write", "seq_lens", "int64", [1], [9]] and len(lead) == 12
    for r in range(1, world):
        assert logs[r]["applied"] == lead, f"rank {r}"
    for r in range(world):
        assert logs[r]["peers"] == {str(p): f"rank {p}" for p in range(world) if p != r}, f"rank {r}"
        assert logs[r]["fds_after"] == logs[r]["fds_before"], f"rank {r} leaked descriptors"


def test_a_follower_that_dies_fails_the_group_naming_it(tmp_path: Path) -> None:
    t0 = time.monotonic()
    exc = run_group(tmp_path, "die", 3)
    assert exc is not None and time.monotonic() - t0 < 30
    err = group_error(exc, tmp_path)
    assert err.rank == 1 and "rank 1" in str(err)
    verdict = tmp_path / "rank0.error"
    if verdict.exists():  # rank 0 saw it before the launcher terminated it
        assert json.loads(verdict.read_text())["names"] == 1
        assert "rank 1 left the step stream" in json.loads(verdict.read_text())["message"]


def test_a_rank_that_never_connects_is_named(tmp_path: Path) -> None:
    t0 = time.monotonic()
    exc = run_group(tmp_path, "noshow", 3, timeout_s=2.0)
    assert exc is not None and time.monotonic() - t0 < 20
    err = group_error(exc, tmp_path)
    assert err.rank == 2  # rank 0 gave up (and told rank 1): whichever exits first, its verdict names rank 2
    assert "rank 2 of 3 did not arrive within 2 s" in str(err)


@pytest.mark.parametrize("mode, text", [
    ("garbage", "rank 1's offer: not a kern offer"),
    ("family", "rank 1's manifest (family digest eeeeeeeeeeee) differs from rank 0's (ffffffffffff)"),
])
def test_a_bad_offer_is_refused_naming_its_rank(tmp_path: Path, mode: str, text: str) -> None:
    exc = run_group(tmp_path, mode, 3)
    assert exc is not None
    err = group_error(exc, tmp_path)
    assert isinstance(err, TpGroupError) and err.rank == 1 and text in str(err)
    for r in range(3):  # every rank that got as far as judging the offers names rank 1
        path = tmp_path / f"rank{r}.error"
        if path.exists():
            assert json.loads(path.read_text())["names"] == 1, r


def test_a_follower_refusing_a_step_reports_it(tmp_path: Path) -> None:
    exc = run_group(tmp_path, "reject", 2)
    assert exc is not None
    err = group_error(exc, tmp_path)
    assert err.rank == 1 and "unknown program 'bad'" in str(err)


def test_an_all_reduce_timeout_on_rank_zero_names_the_lost_rank(tmp_path: Path) -> None:
    exc = run_group(tmp_path, "lost", 2)
    assert exc is not None and exc.rank == 0
    err = group_error(exc, tmp_path)
    assert err.rank == 1
    assert "a one-shot all-reduce / all-gather gave up waiting for rank 1 (block 0, call 7)" in str(err)


def test_status_words() -> None:
    err = status_error(0, [1, 3, 2, 40])
    assert isinstance(err, AllreduceTimeoutError) and err.rank == 3
    refused = status_error(2, [2, 12, 8, 2])
    assert not isinstance(refused, AllreduceTimeoutError) and refused.rank == 2 and "count 12, grid 8" in str(refused)


def test_frames_are_bounded_and_checked() -> None:
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, {"op": "issue", "program": "decode"}, b"xyz")
        assert recv_frame(b) == ({"op": "issue", "program": "decode"}, b"xyz")
        a.sendall((70_000).to_bytes(4, "big") + (0).to_bytes(8, "big"))
        with pytest.raises(ValueError, match="more than"):
            recv_frame(b)
    a, b = socket.socketpair()
    with a, b:
        head = b"[1, 2]"
        a.sendall(len(head).to_bytes(4, "big") + (0).to_bytes(8, "big") + head)
        with pytest.raises(ValueError, match="not an object"):
            recv_frame(b)
        a.close()
        with pytest.raises(EOFError):
            recv_frame(b)


def test_accept_names_a_follower_that_never_joins(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen(4)
    one = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    one.connect(str(tmp_path / "s.sock"))
    send_frame(one, {"op": "hello", "rank": 1})
    t0 = time.monotonic()
    with pytest.raises(StepRankError, match="rank 2 of 3 did not join the step stream within 0.3 s") as info:
        StepSender.accept(listener, 3, 0.3)
    assert info.value.rank == 2 and time.monotonic() - t0 < 3
    one.close()
    two = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    two.connect(str(tmp_path / "s.sock"))
    send_frame(two, {"op": "hello", "rank": 5})
    with pytest.raises(StepRankError, match="does not name a new rank of 1..2"):
        StepSender.accept(listener, 3, 2.0)
    two.close()
    listener.close()


def test_request_round_trips_the_config(tmp_path: Path) -> None:
    from kern_run.config import RunConfig

    cfg = RunConfig(tmp_path / "m.json", tmp_path / "k", (tmp_path / "a.safetensors", tmp_path / "b.safetensors"),
                    gpu=2, capacity_tokens=1024, chunk=64)
    req = json.loads(json.dumps(request_json(cfg, "hello", 8, False, True, 4, "debug")))
    back = config_of(req)
    assert (back.manifest, back.kernels, back.weights, back.gpu, back.capacity_tokens, back.chunk) == (
        cfg.manifest, cfg.kernels, cfg.weights, 2, 1024, 64)
    assert (req["prompt"], req["steps"], req["tp"], req["ignore_eos"]) == ("hello", 8, 4, True)


def test_status_buffer_comes_from_the_rank_manifest() -> None:
    from kern_manifest import parse_manifest
    from kern_run.models import qwen3 as g

    repo = Path(__file__).resolve().parents[2]
    abi = g.KernelAbi.from_json(json.loads((repo / "kernels" / "kernels.json").read_text()))
    cfg = g.Qwen3Config.from_name("tiny")
    (m0, _) = g.build_rank_manifests(cfg, abi, g.BuildOptions("tiny", 64, 4096), 2)
    assert status_buffer(parse_manifest(m0)) == "ar_status"
    (n0, _) = g.build_rank_manifests(cfg, abi, g.BuildOptions("tiny", 64, 4096, decode="gemm",
                                                              allreduce_oneshot_bytes=0), 2)
    assert status_buffer(parse_manifest(n0)) == "ar_status"  # the vocabulary-parallel lm_head's all-gather
    assert n0["meta"]["tp"]["allreduce"] == {"oneshot_bytes": 0}
    assert n0["meta"]["tp"]["lm_head"]["status"] == "ar_status"
    (r0, _) = g.build_rank_manifests(cfg, abi, g.BuildOptions("tiny", 64, 4096, decode="gemm",
                                                              allreduce_oneshot_bytes=0, tp_lm_head="replicated"), 2)
    assert status_buffer(parse_manifest(r0)) is None


def test_cli_tp_starts_rank_processes_unless_local(monkeypatch: pytest.MonkeyPatch, tiny_manifest: Path,
                                                   kernels_dir: Path, tiny_ckpt: Path) -> None:
    """`kern run --tp 2` goes to tp_procs.run_tp_procs (the ranks as processes), `--tp-local` to tp.run_tp."""
    from typer.testing import CliRunner

    from kern_run import tp, tp_procs
    from kern_run.cli import app

    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(tp_procs, "run_tp_procs", lambda cfg, text, steps, eager, ie, n, level, **kw:
                        seen.append(("procs", n)))
    monkeypatch.setattr(tp, "run_tp", lambda cfg, text, steps, eager, ie, n, log, out=None: seen.append(("local", n)))
    base = ["run", "--manifest", str(tiny_manifest), "--kernels", str(kernels_dir), "--weights", str(tiny_ckpt),
            "--prompt", "hi", "--tp", "2", "--greedy"]
    for extra in ([], ["--tp-local"]):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 0, result.output
    assert seen == [("procs", 2), ("local", 2)]


def test_rank_jobs_write_what_run_jobs_reads(tmp_path: Path) -> None:
    """Rank 0's side of run_jobs (tp_procs.run_rank_jobs) over a fake Generator: each job's call, result.json and
    the teacher-forced logits as .npy."""
    from types import SimpleNamespace

    from kern_run.tp_procs import run_rank_jobs

    calls: list[tuple] = []

    class FakeGen:
        rt = SimpleNamespace(weight_load_stats=(123, 0.5))

        def generate(self, ids, opts):
            calls.append(("generate", ids, opts.max_new_tokens, opts.eager, opts.lookahead, opts.stop_at_eos))
            timings = SimpleNamespace(token_s=[0.0, 0.1, 0.3], prefill_s=0.05, pipelined=True)
            return SimpleNamespace(tokens=[7, 8, 9], timings=timings)

        def teacher_forced(self, ids, prefill_tokens, chunk):
            calls.append(("teacher_forced", ids, prefill_tokens, chunk))
            return np.arange(6, dtype=np.float32).reshape(2, 3), np.asarray([2, 2])

    jobs = [{"kind": "generate", "name": "g", "prompt_ids": [1, 2], "steps": 3, "lookahead": 0},
            {"kind": "teacher_forced", "name": "t", "ids": [4, 5, 6], "prefill_tokens": 1}]
    run_rank_jobs(FakeGen(), {"jobs": jobs, "result_dir": str(tmp_path)}, 64)
    assert calls == [("generate", [1, 2], 3, False, 0, False), ("teacher_forced", [4, 5, 6], 1, 64)]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"jobs": {"g": {"tokens": [7, 8, 9], "token_s": [0.0, 0.1, 0.3], "prefill_s": 0.05,
                                     "pipelined": True}, "t": {"argmax": [2, 2]}}, "weights": [123, 0.5]}
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), np.arange(6, dtype=np.float32).reshape(2, 3))
    from kern_run.errors import RefusalError

    with pytest.raises(RefusalError, match="unknown kind 'other'"):
        run_rank_jobs(FakeGen(), {"jobs": [{"kind": "other", "name": "x"}], "result_dir": str(tmp_path)}, 64)


def test_run_tp_procs_refuses_on_the_host_before_any_rank_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  tiny_manifest: Path, kernels_dir: Path,
                                                                  tiny_ckpt: Path) -> None:
    """Missing rank manifests, then (on this GPU-less machine) a rank's GPU (the first missing): refused in the
    parent, no rank process started."""
    import shutil

    from kern_run import tp, tp_procs
    from kern_run.config import RunConfig
    from kern_run.errors import NoDeviceError, RefusalError

    monkeypatch.setattr(tp_procs, "spawn_ranks", lambda *a, **k: pytest.fail("a rank was started"))
    manifest = tmp_path / "m.json"
    shutil.copyfile(tiny_manifest, manifest)
    cfg = RunConfig(manifest, kernels_dir, tiny_ckpt, capacity_tokens=64)
    with pytest.raises(RefusalError, match="rank manifest"):
        tp_procs.run_tp_procs(cfg, "hello", 4, False, False, 2, "info")
    for r in range(2):
        shutil.copyfile(tiny_manifest, tp.rank_manifest(manifest, 2, r))
    probed: list[int] = []

    def probe(gpu: int) -> int:
        probed.append(gpu)
        if gpu == 1:
            raise NoDeviceError(f"no GPU {gpu}")
        return 1

    monkeypatch.setattr(tp_procs, "probe_device", probe)
    with pytest.raises(NoDeviceError, match="no GPU 1"):
        tp_procs.run_tp_procs(cfg, "hello", 4, False, False, 2, "info")
    assert probed == [0, 1]
