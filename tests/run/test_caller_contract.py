"""The declared caller contract (kern_run.contract): kern_runtime.Runtime and the TP group's TpRuntime implement
CallerRuntime with the same signatures, the optional protocols are where they should be, the page sources are
PageSources, kern_run probes no runtime with getattr / hasattr and imports only the packages' exported names."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import kern_run
import pytest
from fake_pool_runtime import FakePoolRuntime
from kern_run.contract import CallerRuntime, DeviceSteps, PageSource, PrefixRuntime
from kern_run.tp import TpRuntime
from kern_run_testutil import FakeRuntime

KERN_RUN = Path(kern_run.__file__).parent


def protocol_members(proto: type) -> dict[str, Any]:
    """name -> the protocol's declaration (a function, a property, or the annotation of a data member), its own
    and its protocol bases'."""
    members: dict[str, Any] = {}
    for cls in reversed(proto.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        members.update({name: ann for name, ann in cls.__dict__.get("__annotations__", {}).items()})
        members.update({name: value for name, value in vars(cls).items() if not name.startswith("_")})
    return members


def signature_faults(proto: type, impl: type) -> list[str]:
    """How class `impl` departs from protocol `proto`, read from the class alone (no instance): a missing member,
    a property that is a method (or the reverse), a method whose parameters differ from the protocol's in name,
    position, kind or default (an extra parameter must have a default), or a data member that is neither a class
    attribute nor assigned as `self.NAME` in the class's source."""
    faults = []
    for name, decl in protocol_members(proto).items():
        have = getattr(impl, name, None)  # on a class: the function or property itself (a façade's delegated one too)
        if not (inspect.isfunction(decl) or isinstance(decl, property)):  # a data member
            if have is None and not any(re.search(rf"\bself\.{name}\b\s*(:[^=\n]+)?=", inspect.getsource(c))
                                        for c in impl.__mro__ if c is not object):
                faults.append(f"{impl.__name__} has no {name}")
            continue
        if have is None:
            faults.append(f"{impl.__name__} has no {name}")
        elif isinstance(decl, property) != isinstance(have, property):
            faults.append(f"{impl.__name__}.{name}: {'a property' if isinstance(decl, property) else 'a method'} "
                          "in the protocol")
        elif inspect.isfunction(decl):
            want = list(inspect.signature(decl).parameters.values())
            got = list(inspect.signature(have).parameters.values())
            for i, p in enumerate(want):
                q = got[i] if i < len(got) else None
                if q is None or (q.name, q.kind, q.default) != (p.name, p.kind, p.default):
                    faults.append(f"{impl.__name__}.{name} parameter {i}: {q} where the protocol has {p}")
            faults += [f"{impl.__name__}.{name}: extra parameter {q} without a default" for q in got[len(want):]
                       if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return faults


def _group(n: int = 2) -> SimpleNamespace:
    """A LocalGroup stand-in over fake ranks sharing a pool layout (what TpRuntime reads of it)."""
    from kern_pool import Layout

    ranks = [FakeRuntime(num_pages=9) for _ in range(n)]
    for r in ranks:
        r.pool = SimpleNamespace(layout=Layout.simple(16, pages=8))
    return SimpleNamespace(runtimes=ranks, write_input=lambda name, array: None, issue=lambda *a, **k: None,
                           close=lambda: None)


@pytest.mark.parametrize("impl", [pytest.param("Runtime", id="kern_runtime.Runtime"), pytest.param("TpRuntime"),
                                  pytest.param("StreamingRuntime")])
def test_the_runtimes_implement_the_caller_contract_with_its_signatures(impl: str) -> None:
    """Checked on the classes: kern_runtime.Runtime needs no device for it. StreamingRuntime: rank 0 of a TP group
    of processes (kern_run.tp_steps), which also has the pipelined loop's DeviceSteps."""
    from kern_run.tp_steps import StreamingRuntime
    from kern_runtime import Runtime

    cls = {"Runtime": Runtime, "TpRuntime": TpRuntime, "StreamingRuntime": StreamingRuntime}[impl]
    assert signature_faults(CallerRuntime, cls) == []
    if impl == "StreamingRuntime":
        assert signature_faults(DeviceSteps, cls) == []


def test_the_optional_protocols() -> None:
    """Runtime has the pipelined loop's DeviceSteps and the prefix pool API; the TP group neither (the Generator
    runs its synchronous loop there, and `kern run --prompts` is single-GPU)."""
    from kern_runtime import Runtime

    assert signature_faults(DeviceSteps, Runtime) == [] and signature_faults(PrefixRuntime, Runtime) == []
    tp = TpRuntime(_group())
    assert isinstance(tp, CallerRuntime) and not isinstance(tp, DeviceSteps) and not isinstance(tp, PrefixRuntime)
    assert signature_faults(DeviceSteps, TpRuntime) == ["TpRuntime has no record_event", "TpRuntime has no host_array"]
    assert isinstance(FakePoolRuntime(), PrefixRuntime) and not isinstance(FakeRuntime(), PrefixRuntime)


def test_the_signature_check_sees_a_departure() -> None:
    class Drifted:
        page_tokens = 16

        def __init__(self) -> None:
            self.num_tokens = 0  # not weight_load_stats

        @property
        def num_pages(self) -> int: ...

        def write_input(self, name: str, array: Any) -> None: ...

        def issue(self, program: str, values: dict[str, int] | None = None, eager: bool = False) -> None: ...

        def read_output(self, name: str, rows: int | None = None, *, copy: bool) -> Any: ...

        def read_buffer(self, name: str, rows: int | None = None) -> Any: ...

        def lease(self, num_tokens: int, *, wait: bool = True) -> Any: ...

        def describe(self) -> dict[str, Any]: ...

        def into_resident(self) -> None: ...

    assert signature_faults(CallerRuntime, Drifted) == [
        "Drifted has no weight_load_stats",
        "Drifted.page_tokens: a property in the protocol",
        "Drifted.issue parameter 2: values: 'dict[str, int] | None' = None where the protocol has "
        "vars: 'Mapping[str, int] | None' = None",
        "Drifted.read_output: extra parameter copy: 'bool' without a default",
        "Drifted has no close",
    ]


def test_page_sources_are_page_sources() -> None:
    from kern_pool import Prefix
    from kern_run.generate import SeqPages
    from kern_run.prefix_cache import PrefixPages

    rt = FakePoolRuntime(num_pages=9)
    sources = [SeqPages(rt, 16), PrefixPages(rt, Prefix(), 32, 16)]
    assert all(isinstance(s, PageSource) for s in sources)
    assert [s.max_tokens for s in sources] == [128, 128]  # 8 pages besides the scratch page
    assert [s.reserve(40).page_ids for s in sources] == [(1, 2, 3), (4, 5, 6)]
    for s in sources:
        s.release()
    assert rt.kern_pool.held_pages == 0


def _calls(tree: ast.AST, names: set[str]) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]


def test_kern_run_probes_no_runtime() -> None:
    """No getattr / hasattr in kern_run outside the CLI's click-error introspection (cli.py), the log-level
    lookup (log.py) and harvest/capture.py (which reads cupti-python's callback records and enums, whose fields
    differ across its releases; no kern runtime is probed there): a capability is declared in kern_run.contract."""
    found = {p.name: _calls(ast.parse(p.read_text()), {"getattr", "hasattr"})
             for p in sorted(KERN_RUN.rglob("*.py")) if p.name not in ("cli.py", "log.py", "capture.py")}
    assert {name: lines for name, lines in found.items() if lines} == {}


# names kern_run imports from a submodule because its package does not export them yet (issue 24: the runtime
# restructure exports them; then drop them here and import from the top level)
# kern_run importing only exported names: tests/test_layering.py test_callers_import_only_exported_names
