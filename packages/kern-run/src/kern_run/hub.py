"""`--weights ORG/NAME`: a Hugging Face hub id found in the local hub cache, without any network access.

The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
`~/.cache/huggingface/hub` (huggingface_hub's order). A model `Qwen/Qwen3-8B` lives in
`models--Qwen--Qwen3-8B/snapshots/<revision>/`; `refs/main` names the revision to take. Without refs/main the one
snapshot there is taken (several: refused, naming them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ConfigError

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# a revision refs/main may name: a commit hash or a plain name; no slash, no leading dot (so never `..`)
_REVISION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def hub_cache() -> tuple[Path, str]:
    """(the hub cache directory, how it was chosen: the variable that set it, or "default")."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]), "HF_HUB_CACHE"
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub", "HF_HOME"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub", "XDG_CACHE_HOME"
    return Path.home() / ".cache" / "huggingface" / "hub", "default"


def is_hub_id(text: str) -> bool:
    """Whether `text` reads as `org/name` (one slash, no leading dot or slash) and names no existing path."""
    return bool(_HUB_ID.fullmatch(text)) and not Path(text).exists()


def snapshot_dir(hub_id: str) -> Path:
    """The snapshot directory of `hub_id` in the local hub cache. Raises ConfigError, in one line naming where it
    looked, when the model is not there, refs/main names a revision that is not a plain name (a path such as
    `../../..` would lead out of the cache) or has no snapshot (dangling), or there is no
    refs/main and several snapshots."""
    cache, chosen = hub_cache()
    org, name = hub_id.split("/")
    repo = cache / f"models--{org}--{name}"
    where = f"{cache} ({chosen})" if chosen != "default" else str(cache)
    if not repo.is_dir():
        raise ConfigError(f"--weights {hub_id}: no such directory, and not in the Hugging Face cache: no {repo.name} "
                          f"in {where} (kern never downloads: fetch it with `huggingface-cli download {hub_id}`, or "
                          "pass the checkpoint directory)")
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="utf-8").strip()
        if not _REVISION.fullmatch(revision):
            raise ConfigError(f"--weights {hub_id}: {ref} names revision {revision[:80]!r}: expected a commit hash or "
                              "a plain name (letters, digits, '.', '_', '-'; no slash, no leading dot)")
        snap = repo / "snapshots" / revision
        if not snap.is_dir():
            raise ConfigError(f"--weights {hub_id}: {ref} names revision {revision!r}, but {snap} does not exist "
                              "(an interrupted download?)")
        return snap
    snaps = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
    if len(snaps) == 1:
        return snaps[0]
    if not snaps:
        raise ConfigError(f"--weights {hub_id}: {repo} holds no snapshot (no refs/main, snapshots/ empty)")
    raise ConfigError(f"--weights {hub_id}: {repo} has no refs/main and {len(snaps)} snapshots "
                      f"({', '.join(p.name for p in snaps)}): pass one snapshot directory")


def resolve_weights_arg(text: str) -> Path:
    """A --weights value as a path: the path itself, or a hub id's snapshot directory (`snapshot_dir`)."""
    return snapshot_dir(text) if is_hub_id(text) else Path(text)
