"""Helpers for tests/train: load the tools/ scripts as modules and make small English corpora."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[2] / "tools"

SENTENCES = (
    "The cat sat on the mat and looked at the door.",
    "A small dog ran across the garden to find its ball.",
    "When the rain stopped, the children went outside to play.",
    "The old man read a book by the window every morning.",
    "She opened the letter and smiled at the good news.",
    "If the file does not exist, the program creates it.",
    "The river flows through the valley toward the sea.",
    "Every process has a parent, except the first one.",
)


def load_tool(name: str) -> ModuleType:
    """Import tools/<name>.py as a module (tools/ is not a package)."""
    module_name = f"kern_tools_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look the module up while the class is created
    spec.loader.exec_module(module)
    return module


def english_documents(n_docs: int, sentences_per_doc: int, seed: int = 0) -> list[str]:
    """n_docs documents of shuffled SENTENCES, reproducible for a seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(SENTENCES) for _ in range(sentences_per_doc)) for _ in range(n_docs)]
