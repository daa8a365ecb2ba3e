"""The pins file a search writes (format `kern-cublaslt-pins/1`; `kern manifest build --algos` reads it):

    {"format": "kern-cublaslt-pins/1", "device": "NVIDIA H200", "cublaslt_version": 130100, "m_max": 2048,
     "pins": [{"n": 6144, "k": 2560, "algo": {"id": .., "tile": .., ...}, "us_512": .., "us_max": ..,
               "heuristic_us_512": .., "heuristic_us_max": .., "heuristic_invariant": false, "candidates": ..}],
     "decode_pins": [{"n": .., "k": .., "algo": {..}, "us_1": .., "heuristic_us_1": .., "candidates": ..}],
     "invariant_decode_pins": [{"n": .., "k": .., "algo": {..}, "us_1": .., "us_8": .., "us_64": .., "m_max": 64,
                                "candidates": ..}]}

`pins` are batch-invariant up to M = m_max (search.pick_prefill_pin), `decode_pins` (optional) the fastest at
M = 1 (search.pick_decode_pin), `invariant_decode_pins` (optional; split-K allowed) batch-invariant up to their
own row's m_max, 64 (search.pick_invariant_decode_pin); times in microseconds on `device` with that cuBLASLt.
The optional lists came after format 1 without changing it: a reader that does not know one ignores it, and
a file without one reads as before.
"""

from __future__ import annotations

import json
from typing import Any

PINS_FORMAT = "kern-cublaslt-pins/1"


def pins_document(device: str, cublaslt_version: int, m_max: int, pins: list[dict[str, Any]],
                  decode_pins: list[dict[str, Any]] | None = None,
                  invariant_decode_pins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The pins file's object, the rows in the order given; `decode_pins` / `invariant_decode_pins` None: no such
    key."""
    doc: dict[str, Any] = {"format": PINS_FORMAT, "device": device, "cublaslt_version": cublaslt_version,
                           "m_max": m_max, "pins": list(pins)}
    if decode_pins is not None:
        doc["decode_pins"] = list(decode_pins)
    if invariant_decode_pins is not None:
        doc["invariant_decode_pins"] = list(invariant_decode_pins)
    return doc


def pins_text(doc: dict[str, Any]) -> str:
    """The file's text: one-space indent, a trailing newline (as tools/pick_algos.py has always written it)."""
    return json.dumps(doc, indent=1) + "\n"
