"""kern_run.harvest.addresses at the edges of the two liveness rules (docs/harvest.md "Pointer classes"): a value at
a tensor's end, a zero-size view, an output whose allocation does not exist yet next to a tensor that ends where it
starts."""

from __future__ import annotations

from kern_run.harvest.addresses import LiveAllocations, NamedRanges, Pointer, classify_param, owners
from kern_run.harvest.capture_format import Alloc, Free, Tensor

BASE = 0x7F00_0000_0000


def u64(v: int) -> bytes:
    return v.to_bytes(8, "little")


def test_a_zero_size_output_at_the_start_of_its_own_allocation_is_that_output() -> None:
    out = Tensor("empty", "output", BASE, 0, "bf16", (0,))
    named, live = NamedRanges((out,), 0), LiveAllocations()
    live.alloc(Alloc(BASE, 256))
    owned = owners((out,), live)
    assert owned == {"empty": 0}
    assert classify_param(u64(BASE), named, live, owned) == Pointer("output", "empty", 0)


def test_a_pointer_at_the_end_of_an_output_view_inside_its_allocation_is_that_output() -> None:
    view = Tensor("logits", "output", BASE, 128, "bf16", (64,))
    named, live = NamedRanges((view,), 0), LiveAllocations()
    live.alloc(Alloc(BASE, 512))  # the view is the first 128 bytes of its allocation
    owned = owners((view,), live)
    assert classify_param(u64(BASE + 128), named, live, owned) == Pointer("output", "logits", 128)


def test_a_value_at_a_state_end_where_an_unallocated_output_starts_is_the_state_end() -> None:
    state = Tensor("kv.0", "state", BASE, 256, "bf16", (128,))
    out = Tensor("next_token", "output", BASE + 256, 8, "i64", (1,))
    named = NamedRanges((state, out), 0)
    final = LiveAllocations()
    final.alloc(Alloc(BASE + 256, 8))  # the output's allocation, made late in the step
    owned = owners((state, out), final)
    early = LiveAllocations()  # a launch before it exists
    assert classify_param(u64(BASE + 256), named, early, owned) == Pointer("state", "kv.0", 256)
    assert classify_param(u64(BASE + 256), named, final, owned) == Pointer("output", "next_token", 0)


def test_a_value_at_a_state_end_inside_a_live_intermediate_is_the_intermediate() -> None:
    state = Tensor("kv.0", "state", BASE, 256, "bf16", (128,))
    named, live = NamedRanges((state,), 0), LiveAllocations()
    live.alloc(Alloc(BASE + 256, 64))
    assert classify_param(u64(BASE + 256), named, live, {}) == Pointer("workspace", "#0", 0)
    live.free(Free(BASE + 256))
    assert classify_param(u64(BASE + 256), named, live, {}) == Pointer("state", "kv.0", 256)
