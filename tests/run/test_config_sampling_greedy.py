"""The committed kern.toml's default target samples (tiny-en loops under greedy: docs/perf.md, eighteenth session),
and `kern run --greedy` drops those defaults."""

from __future__ import annotations

from pathlib import Path

from kern_run.cli import run_sampling
from kern_run.config import load_targets

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_en_samples_by_default_and_greedy_drops_it() -> None:
    default, targets = load_targets(ROOT / "kern.toml")
    assert default == "tiny-en"
    defaults = tuple(targets["tiny-en"]["sampling"])
    assert dict(defaults) == {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1, "seed": 0}
    sampled, where = run_sampling({}, defaults, "tiny-en")
    assert not sampled.greedy and where.startswith("kern.toml target 'tiny-en' sampling temperature = 0.8")
    greedy, _ = run_sampling({}, (), "tiny-en")  # what --greedy passes
    assert greedy.greedy and not greedy.penalizes
