"""The layers read one way: no import circle among harness modules, and the engine-free pipeline imports no
engine package (only the registry, harness/engines/__init__.py, and the contract: harness/engines/base.py and
capabilities.py).

Imports inside functions count (they are edges all the same when the function runs); imports under
`if TYPE_CHECKING:` do not (they never run).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "harness"
CONTRACT = ("harness.engines.base", "harness.engines.capabilities")  # what the pipeline may import of engines/


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph(mods: dict[str, Path], sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse((sources or {}).get(m) or p.read_text())
        typing_only = {id(x) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                       for b in n.body for x in ast.walk(b)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                r = resolve(n) if n.startswith("harness") else None
                if r and r != m:
                    graph[m].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert cycles(import_graph(_modules())) == []


def test_pipeline_imports_no_engine_package():
    graph = import_graph(_modules())
    bad = sorted((m, x) for m, deps in graph.items() if not m.startswith("harness.engines")
                 for x in deps if x.startswith("harness.engines.") and x not in CONTRACT)
    assert bad == []


def test_the_walk_finds_a_reintroduced_circle():
    mods = _modules()
    src = mods["harness.hardware"].read_text() + "\n\ndef _f():\n    from harness.engines.vllm import derive_dtype\n"
    graph = import_graph(mods, {"harness.hardware": src})
    assert any("harness.hardware" in c and "harness.engines.vllm" in c for c in cycles(graph))


# ---- the layers docs/harness.md draws ----------------------------------------------------------------------------

DOC = ROOT.parent / "docs" / "harness.md"
MAX_UPWARD = 3


def drawn_layers(text: str) -> dict[str, int]:
    """The drawing under "### The layers": each name (or `pkg.*`, `pkg.*.mod`) -> its line, 0 the bottom."""
    block = text.split("### The layers", 1)[1].split("```", 2)[1]
    lines = [line for line in block.strip("\n").split("\n") if line.strip()]
    return {name: i for i, line in enumerate(reversed(lines)) for name in re.split(r",\s*", line.strip())}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The line of a module: its own name's, else the most specific `.*` pattern's that matches it."""
    rel = "harness" if module == "harness" else module[len("harness."):]
    if rel in layers:
        return layers[rel]
    found = [(len(pat), i) for pat, i in layers.items() if "*" in pat
             and re.fullmatch(re.escape(pat).replace(r"\*", r"[^.]+" if not pat.endswith(".*") or pat.count("*") > 1
                                                    else r".+"), rel)]
    return max(found)[1] if found else None


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    return sorted((m, d) for m, deps in graph.items() for d in deps
                  if (a := layer_of(m, layers)) is not None and (b := layer_of(d, layers)) is not None and b > a)


def test_every_module_has_a_layer_and_at_most_three_imports_go_up():
    layers = drawn_layers(DOC.read_text())
    graph = import_graph(_modules())
    assert [m for m in graph if layer_of(m, layers) is None] == [], "add them to docs/harness.md's drawing"
    assert len(upward(graph, layers)) <= MAX_UPWARD, upward(graph, layers)


def test_the_layer_check_finds_an_import_upwards():
    layers = drawn_layers(DOC.read_text())
    mods = _modules()
    src = mods["harness.paths"].read_text() + "\n\ndef _f():\n    from harness import report\n"
    found = upward(import_graph(mods, {"harness.paths": src}), layers)
    assert ("harness.paths", "harness.report") in found
    assert layer_of("harness.workloads.serving.views", layers) == layer_of("harness.report", layers)
    assert layer_of("harness.engines.vllm", layers) > layer_of("harness.engines.base", layers)


# ---- rooms of a readable size ----------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED = 3  # the engines' run loops (the vLLM worker's, the vLLM and server engines')


def _sources() -> list[Path]:
    return sorted([*ROOT.rglob("*.py"), *(ROOT.parent / "runtime").rglob("*.py")])


def long_functions(paths: list[Path], root: Path) -> list[tuple[int, str]]:
    """(lines, path:name) of every function longer than MAX_FUNCTION_LINES, longest first."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append((n, f"{p.relative_to(root)}:{node.name}"))
    return sorted(out, reverse=True)


def test_no_module_over_600_lines():
    big = {str(p.relative_to(ROOT.parent)): n for p in _sources()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert big == {}, "split these along their concepts"


def test_at_most_three_functions_over_80_lines():
    found = long_functions(_sources(), ROOT.parent)
    assert len(found) <= LONG_FUNCTIONS_ALLOWED, found


def test_the_size_rule_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\nclass C:\n    def g(self):\n        pass\n")
    assert long_functions([tmp_path / "m.py"], tmp_path) == [(MAX_FUNCTION_LINES + 1, "m.py:f")]
