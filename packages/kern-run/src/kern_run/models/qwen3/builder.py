"""Builder: accumulates buffers, states and ops of one manifest, checking every kernel launch's wiring against
the kernel contract; and the small constructors of interface arguments and calls the other modules share."""

from __future__ import annotations

from typing import Any

from ...errors import ManifestBuildError
from .abi import KERNEL_SIGNATURES, PDL_ENTRIES, KernelAbi


def ptr(name: str) -> dict[str, str]:
    """A pointer interface argument of an op."""
    return {"name": name, "kind": "ptr"}


def int_arg(name: str) -> dict[str, str]:
    """An integer interface argument of an op."""
    return {"name": name, "kind": "int"}


def call(op: str, **args: Any) -> dict[str, Any]:
    """One program call of `op` with its arguments (buffer names, var expressions, `pages_of`)."""
    return {"op": op, "args": args}


def pages_of(layer: int) -> dict[str, str]:
    """The page-id bound of layer `layer`'s attention: the pages of its KV state's reserved range."""
    return {"pages_of": f"kv.{layer}"}


def tokens_i32() -> dict[str, str]:
    """The `tokens` var as an i32 launch argument."""
    return {"expr": "tokens", "type": "i32"}


def wiring_types(args: list[dict[str, Any]]) -> list[str]:
    """The contract type of each wiring (pointer wirings forward ptr args / scratch / null)."""
    out = []
    for w in args:
        if "scratch" in w or "null" in w or ("arg" in w and "type" not in w):
            out.append("p")
        elif "f32" in w:
            out.append("f32")
        elif "i32" in w or w.get("type") == "i32":
            out.append("i32")
        elif "i64" in w or w.get("type") == "i64":
            out.append("i64")
        else:
            raise AssertionError(f"wiring {w} has no contract type")  # a bug in this builder
    return out


class Builder:
    """Accumulates modules, buffers, states and ops into one manifest object."""

    def __init__(self, abi: KernelAbi, carveout: int | None = None) -> None:
        self.abi = abi
        self.carveout = carveout  # `carveout` of every kernel launch (None: not written)
        self.used_modules: set[str] = set()
        self.buffers: dict[str, Any] = {}
        self.states: dict[str, Any] = {}
        self.ops: dict[str, Any] = {}

    def launch(self, entry: str, grid: list[Any], block: list[Any], args: list[dict[str, Any]],
               shared_mem: Any = 0, pdl: bool = False) -> dict[str, Any]:
        """A kernel launch of `entry`, its params from kernels.json; checks the wiring against the contract.
        `pdl`: launch with programmatic dependent launch (only entries of PDL_ENTRIES). Raises
        ManifestBuildError when kernels.json lacks the entry."""
        if entry not in self.abi.entries:
            raise ManifestBuildError(f"{self.abi.source} has no entry {entry!r} (expected in module "
                                     f"{KERNEL_SIGNATURES[entry][0]!r}), which these options use; rebuild with "
                                     "tools/build_kernels.py")
        module, params = self.abi.entries[entry]
        types = KERNEL_SIGNATURES[entry][1]
        got = wiring_types(args)
        assert got == list(types), f"{entry}: wiring types {got} != contract {types}"  # a bug in this builder
        assert not pdl or entry in PDL_ENTRIES, f"{entry} does not wait for its predecessor: never pdl"
        self.used_modules.add(module)
        out = {"module": module, "entry": entry, "grid": grid, "block": block, "shared_mem": shared_mem,
               "params": params, "args": args}
        if pdl:
            out["pdl"] = True
        if self.carveout is not None:
            out["carveout"] = self.carveout
        return out

    def op(self, name: str, args: list[dict[str, str]], launches: list[dict[str, Any]],
           scratch: dict[str, Any] | None = None) -> None:
        """Declare op `name`: its interface `args`, its launches, its private scratch (name -> bytes expr)."""
        op: dict[str, Any] = {"args": args, "launches": launches}
        if scratch:
            op["scratch"] = scratch
        self.ops[name] = op

    def buffer(self, name: str, kind: str, dtype: str, shape: list[Any], bind: list[dict[str, Any]] | None = None,
               placement: str | None = None, export: bool = False, peers: dict[str, str] | None = None) -> None:
        """Declare buffer `name` (shape: element counts or var expressions); `export`: peer-visible; `peers`: a
        peer table `{"of": buffer, "group": group}` (docs/manifest.md)."""
        buf: dict[str, Any] = {"kind": kind, "dtype": dtype, "shape": shape}
        if bind is not None:
            buf["bind"] = bind
        if placement is not None:
            buf["placement"] = placement
        if export:
            buf["export"] = True
        if peers is not None:
            buf["peers"] = peers
        self.buffers[name] = buf
