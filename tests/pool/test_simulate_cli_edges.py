"""`kern-pool simulate` as a new user meets it: a bad --png refused before the sweep, reference curves only for
the trace and settings they were measured on, progress on a terminal, capacities printed exactly."""

from __future__ import annotations

import io
import math
import shutil
from pathlib import Path

import pytest

from kern_pool.cli import main, sweep_progress, tokens_text
from kern_pool.simulate import SWEEP_TOKENS, SimConfig, simulate
from kern_pool.sweep_plot import REFERENCES, check_png_path, reference_for

DATA = Path(__file__).parent / "data"
TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation_trace.jsonl"


@pytest.fixture
def conversation() -> Path:
    if not CONVERSATION.is_file():
        pytest.fail(f"trace {CONVERSATION} missing: CI must provide ../shared/traces next to the repository")
    return CONVERSATION


@pytest.mark.parametrize("png, line", [
    ("out.txt", "kern-pool: --png out.txt: the file name must end in .png (the curve is written as a PNG image)"),
    ("/nonexistent/dir/x.png", "kern-pool: --png /nonexistent/dir/x.png: the folder /nonexistent/dir does not exist"),
])
def test_a_bad_png_path_is_refused_before_the_sweep(capsys: pytest.CaptureFixture[str], png: str, line: str) -> None:
    rc = main(["simulate", str(DATA / "tiny.jsonl"), "--sweep", "--png", png])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""  # not even the table header: no replay ran
    assert err == line + "\n"


def test_png_path_checks(tmp_path: Path) -> None:
    assert check_png_path(tmp_path / "curve.png") is None
    assert check_png_path(tmp_path / "CURVE.PNG") is None
    (tmp_path / "d.png").mkdir()
    assert check_png_path(tmp_path / "d.png") == f"--png {tmp_path / 'd.png'} exists and is not a regular file"
    assert check_png_path(tmp_path / "curve") == (f"--png {tmp_path / 'curve'}: the file name must end in .png "
                                                  "(the curve is written as a PNG image)")


def test_the_references_name_the_files_they_were_measured_on() -> None:
    assert [(r.name, r.requests) for r in REFERENCES] == [("mooncake_conversation_trace.jsonl", 12031),
                                                          ("mooncake_synthetic_trace.jsonl", 3993)]
    assert REFERENCES[0].caption() == ("references: mooncake_conversation_trace.jsonl (sha256 b8cbb061a852), all "
                                       "12,031 requests, 512-token pages, no host tier, prompt tokens only")


def test_reference_drawn_for_the_full_trace_it_was_measured_on(conversation: Path) -> None:
    ref, which = reference_for(conversation, SimConfig(math.inf))
    assert ref is REFERENCES[0]
    assert which == REFERENCES[0].caption()
    ref, _ = reference_for(conversation, SimConfig(math.inf, limit=12031))  # a --limit that covers it all
    assert ref is REFERENCES[0]


@pytest.mark.parametrize("cfg, reason", [
    (SimConfig(math.inf, limit=300), "--limit 300 replays 300 of its 12,031 requests"),
    (SimConfig(math.inf, page_tokens=256), "--page-tokens 256, not 512"),
    (SimConfig(math.inf, host_tokens=4096), "--host-tokens 4096 adds a host tier"),
    (SimConfig(math.inf, reserve_output=True), "--reserve-output leases output tokens too"),
])
def test_no_reference_for_other_settings(conversation: Path, cfg: SimConfig, reason: str) -> None:
    assert reference_for(conversation, cfg) == (
        None, f"no reference curves: they were measured on all of mooncake_conversation_trace.jsonl; {reason}")


def test_no_reference_for_a_file_merely_named_like_the_trace(tmp_path: Path) -> None:
    named = tmp_path / "my_conversation_trace.jsonl"
    shutil.copy(DATA / "tiny.jsonl", named)
    ref, which = reference_for(named, SimConfig(math.inf))
    assert ref is None
    assert which.startswith("no reference curves: my_conversation_trace.jsonl (sha256 ")
    assert which.endswith("is not a trace they were measured on (mooncake_conversation_trace.jsonl, "
                          "mooncake_synthetic_trace.jsonl)")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_sweep_progress_on_a_terminal_only() -> None:
    results = [simulate(DATA / "tiny.jsonl", SimConfig(cap)) for cap in SWEEP_TOKENS[:2]]
    term = _Terminal()
    assert list(sweep_progress(iter(results), SWEEP_TOKENS[:2], term)) == results
    assert term.getvalue() == ("\r\x1b[Ksweep 1/2: capacity 1e4, 0 s so far\r\x1b[K"
                               "\r\x1b[Ksweep 2/2: capacity 1e5, 0 s so far\r\x1b[K\r\x1b[K")
    log = io.StringIO()
    assert list(sweep_progress(iter(results), SWEEP_TOKENS[:2], log)) == results
    assert log.getvalue() == ""


def test_the_table_prints_the_capacity_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    assert [tokens_text(t) for t in (1e4, 1.5e6, 1536, 1234567, 3e6, 1000, 100, math.inf)] == [
        "1e4", "1.5e6", "1536", "1234567", "3e6", "1e3", "100", "inf"]
    assert main(["simulate", str(DATA / "tiny.jsonl"), "--capacity", "1.5e6"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[:2] == ["1.5e6", "2929"]  # not 2e+06: 1,500,000 tokens = 2929 pages of 512


@pytest.mark.parametrize("capacity", ["1.5", "1500000.5", "2.5e0"])
def test_a_capacity_that_is_not_a_whole_number_is_refused(capsys: pytest.CaptureFixture[str], capacity: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(DATA / "tiny.jsonl"), "--capacity", capacity])
    assert exc.value.code == 2
    assert f"capacity must be a whole number of tokens, got {capacity}" in capsys.readouterr().err


class _Recorder:
    """Stands in for matplotlib (not installed on the CPU machine): records what plot_sweep draws."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self.texts: list[str] = []
        self.saved: list[Path] = []
        self.pyplot = self

    def use(self, backend: str) -> None:
        assert backend == "Agg"

    def subplots(self, figsize: tuple[float, float]) -> tuple["_Recorder", "_Recorder"]:
        return self, self

    def plot(self, xs: list[float], ys: list[float], style: str, label: str) -> None:
        self.labels.append(label)

    def text(self, x: float, y: float, text: str, fontsize: int) -> None:
        self.texts.append(text)

    def savefig(self, path: Path, dpi: int) -> None:
        self.saved.append(path)

    def __getattr__(self, name: str):  # set_xscale, legend, tight_layout, close ...: accepted, ignored
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("with_reference", [True, False])
def test_plot_labels_say_which_references_are_drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    with_reference: bool) -> None:
    import sys

    from kern_pool.sweep_plot import plot_sweep

    fake = _Recorder()
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", fake)
    results = [simulate(DATA / "tiny.jsonl", SimConfig(cap)) for cap in SWEEP_TOKENS[:2]]
    plot_sweep(results, REFERENCES[0] if with_reference else None, tmp_path / "c.png")
    assert fake.saved == [tmp_path / "c.png"]
    if with_reference:
        assert fake.labels == ["kern-pool (this run, 5 requests)",
                               "FAST'25 Fig. 9, mooncake_conversation_trace.jsonl (read off, +-0.02)",
                               "helper baseline (block LRU), mooncake_conversation_trace.jsonl"]
        assert fake.texts == [REFERENCES[0].caption()]
    else:
        assert (fake.labels, fake.texts) == (["kern-pool (this run, 5 requests)"], [])


def test_a_limited_sweep_of_the_real_trace_draws_no_reference(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               conversation: Path) -> None:
    """`--sweep --limit 300 --png` used to draw the full-trace reference curves beside a 300-request run."""
    import sys

    fake = _Recorder()
    fake.__spec__ = "matplotlib (fake)"  # what importlib.util.find_spec reads from sys.modules
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", fake)
    png = tmp_path / "c.png"
    assert main(["simulate", str(conversation), "--sweep", "--limit", "300", "--png", str(png), "--json"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["kern-pool: no reference curves: they were measured on all of mooncake_conversation_trace.jsonl; "
                   "--limit 300 replays 300 of its 12,031 requests", f"wrote {png}"]
    assert fake.labels == ["kern-pool (this run, 300 requests)"] and fake.texts == []
