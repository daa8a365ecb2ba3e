"""The default manifest name of a config.json path (`kern manifest build --config`, `kern run --weights`).

The path is made absolute but symbolic links are not followed: in a Hugging Face cache snapshot config.json is a
link into `blobs/`, whose name says nothing about the model."""

from __future__ import annotations

import os
from pathlib import Path


def model_name(config: str | os.PathLike[str]) -> str:
    """NAME for a hub snapshot (`models--ORG--NAME/snapshots/REV/config.json`); the directory's name when the file
    is literally `config.json` (`/w/qwen3-1.7b/config.json` -> "qwen3-1.7b"); else the file's stem
    (`tests/data/configs/Qwen3-8B.json` -> "Qwen3-8B")."""
    path = Path(os.path.abspath(config))  # `..` folded, links kept
    folder = path.parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name if path.name == "config.json" else path.stem
