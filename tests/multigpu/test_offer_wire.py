"""`Offer.from_bytes` on malformed wire data (issue 29, a fuzz pass): it raised AttributeError (ranks as an array)
and RecursionError (deep nesting) though its docstring promises ApiError, and it accepted negative ranks, byte
counts, GPU numbers and block ranges. Every case is now an ApiError naming the field; hypothesis mutates a valid
offer and checks that nothing else escapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kern_runtime import ApiError
from kern_runtime.peers import OFFER_MAGIC, Offer, PeerBlock, PeerHandle


def _offer() -> Offer:
    handle = PeerHandle("kv.0", "fabric", 4 << 20, (PeerBlock(0, 2 << 20, bytes([1]) * 64),
                                                  PeerBlock(2 << 20, 2 << 20, bytes([2]) * 64)), gpu=1, pid=4242)
    return Offer("a" * 64, "b" * 64, {"tp": 1}, {"kv.0": handle}, {"tp": bytes(range(128))})


def _body() -> dict[str, Any]:
    return json.loads(_offer().to_bytes()[len(OFFER_MAGIC):])


def _wire(body: Any) -> bytes:
    return OFFER_MAGIC + json.dumps(body).encode("ascii")


def _with(path: tuple[Any, ...], value: Any) -> bytes:
    body = _body()
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return _wire(body)


def test_a_valid_offer_round_trips() -> None:
    assert Offer.from_bytes(_offer().to_bytes()) == _offer()
    assert Offer.from_bytes(bytearray(_offer().to_bytes())) == _offer()


@pytest.mark.parametrize("data, message", [
    (_with(("ranks",), []), "malformed kern offer: ranks is an array, expected an object"),  # was AttributeError
    (OFFER_MAGIC + b"[" * 100_000, "malformed kern offer: not usable JSON (nested too deeply)"),  # was RecursionError
    (_with(("ranks", "tp"), -1), "malformed kern offer: rank in group 'tp' is -1, expected an integer >= 0"),
    (_with(("ranks", "tp"), 1.5), "malformed kern offer: rank in group 'tp' is a number, expected an integer >= 0"),
    (_with(("ranks", "tp"), True), "malformed kern offer: rank in group 'tp' is a boolean, expected an integer >= 0"),
    (_with(("handles", "kv.0", "nbytes"), -5), "malformed kern offer: peer handle 'kv.0': nbytes is -5, expected an "
                                               "integer >= 0"),
    (_with(("handles", "kv.0", "gpu"), -1), "malformed kern offer: peer handle 'kv.0': gpu is -1, expected an integer "
                                            ">= 0"),
    (_with(("handles", "kv.0", "blocks", 0, 0), -4), "malformed kern offer: peer handle 'kv.0': block 0 offset is -4, "
                                                     "expected an integer >= 0"),
    (_with(("handles", "kv.0", "blocks", 1, 1), 0), "malformed kern offer: peer handle 'kv.0': block 1 nbytes is 0, "
                                                    "expected an integer >= 1"),
    (_with(("handles", "kv.0", "blocks", 1, 0), 1 << 20), "malformed kern offer: peer handle 'kv.0': block 1 spans "
                                                          "bytes 1048576..3145728; blocks ascend without overlap inside "
                                                          "the 4194304 bytes of the allocation"),
    (_with(("handles", "kv.0", "blocks", 1, 1), 4 << 20), "malformed kern offer: peer handle 'kv.0': block 1 spans "
                                                          "bytes 2097152..6291456; blocks ascend"),
    (_with(("handles", "kv.0", "blocks", 0), [0, 1]), "malformed kern offer: peer handle 'kv.0': block 0 is not "
                                                      "[offset, nbytes, handle]"),
    (_with(("nccl_ids", "tp"), "AAAA"), "malformed kern offer: the NCCL id of group 'tp' is 3 bytes, expected 128"),
    (_with(("nccl_ids", "tp"), "!!"), "malformed kern offer: the NCCL id of group 'tp' is not base64"),
    (_wire({k: v for k, v in _body().items() if k != "digest"}), "malformed kern offer: no 'digest'"),
    (OFFER_MAGIC + b"\xff", "malformed kern offer: not ASCII text (byte 0xff at offset 0)"),
    (b"nonsense", "not a kern offer (the wire form starts with 'KERN-OFFER/1')"),
    ("KERN-OFFER/1\n{}", "a kern offer is bytes (Offer.to_bytes), got str"),
    (None, "a kern offer is bytes (Offer.to_bytes), got NoneType"),
])
def test_malformed_offers_are_api_errors_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ApiError) as info:
        Offer.from_bytes(data)
    assert str(info.value).startswith(message), str(info.value)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=8)


# every place of the offer's JSON a value can be put (the fields, their containers, the block entries)
FIELDS = [("family_digest",), ("digest",), ("ranks",), ("ranks", "tp"), ("handles",), ("handles", "kv.0"),
          *[("handles", "kv.0", k) for k in ("name", "nbytes", "gpu", "pid", "blocks")],
          *[("handles", "kv.0", "blocks", i, j) for i in (0, 1) for j in (0, 1, 2)], ("handles", "kv.0", "blocks", 1),
          ("nccl_ids",), ("nccl_ids", "tp")]


@settings(max_examples=300, deadline=200)
@given(st.integers(0, 10_000), JSON)
def test_any_mutated_offer_is_parsed_or_an_api_error(pick: int, value: Any) -> None:
    data = _with(FIELDS[pick % len(FIELDS)], value)
    try:
        offer = Offer.from_bytes(data)
    except ApiError:
        return
    for handle in offer.handles.values():  # accepted: every count is a non-negative int, blocks inside nbytes
        assert all(type(v) is int and v >= 0 for v in (handle.nbytes, handle.gpu, handle.pid))
        assert all(b.offset >= 0 and b.nbytes >= 1 and b.offset + b.nbytes <= handle.nbytes for b in handle.blocks)
    assert all(type(r) is int and r >= 0 for r in offer.ranks.values())
