"""No engine name outside harness/engines/: what an engine knows lives in its package (docs/engines.md).

The walk fails on a comparison with, a membership test of, or a dict key equal to a registered engine
name in any module of harness/ outside harness/engines/. The second test shows it failing on a branch
put back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.engines import ENGINES
from harness.errors import UserError

ROOT = Path(__file__).resolve().parent.parent / "harness"


def _names(node: ast.AST) -> list[str]:
    """The engine names a node holds as string constants (itself, or the items of a tuple/list/set)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and n.value in ENGINES]


def branches(source: str, where: str = "<source>") -> list[str]:
    """Every comparison with, membership test of (also by set algebra), subscript by, or dict key equal to an
    engine name in the source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found: list[str] = []
        if isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                found += _names(part)
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if k is not None:
                    found += _names(k)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            found += [kw.arg for kw in node.keywords if kw.arg in ENGINES]
        elif isinstance(node, ast.Subscript):
            found += _names(node.slice)
        elif isinstance(node, ast.BinOp):  # {"llama.cpp", ...} - set(arms): a membership test by set algebra
            for part in (node.left, node.right):
                if isinstance(part, (ast.Set, ast.Tuple, ast.List)):
                    found += _names(part)
        out += [f"{where}:{node.lineno}: {n!r}" for n in found]
    return out


def test_no_engine_name_outside_engines():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "engines":
            continue
        found += branches(path.read_text(), str(rel))
    assert not found, "engine names branched on outside harness/engines/:\n" + "\n".join(found)


def test_the_walk_fails_on_a_reintroduced_branch():
    # today's branches, as they were before the engine packages owned them
    assert branches('if a.engine.name != "command":\n    pass\n')
    assert branches('if any(a.engine in ("llama.cpp", "llama-bench") for a in arms):\n    pass\n')
    assert branches('DEFAULT_OVERHEAD = {"vllm": 1 << 30}\n')
    assert branches('x = DEFAULT_OVERHEAD["vllm"]\n')
    assert branches('if {"llama.cpp", "llama-bench"} - set(arms):\n    pass\n')
    assert branches('if "openvino" in names:\n    pass\n')
    assert branches('if engine == "command":\n    pass\n')
    # a field that shares an engine's name counts too (the artifact's "command" is artifact.COMMAND)
    assert branches('rec = {"command": cmd}\n') and branches('rec["command"]\n') and branches('dict(command=cmd)\n')
    assert not branches('rec = {artifact.COMMAND: cmd}\n')
    # what is not a branch: a name in a message or a docstring
    assert not branches('raise ValueError("vllm failed")\n"""llama.cpp pads each context"""\n')
    # and the real tree, with one branch put back, fails
    src = (ROOT / "check" / "__init__.py").read_text()
    assert branches(src + '\nif kind == "vllm":\n    pass\n')


def test_weight_files_follow_the_format_not_the_suffix():
    """What residency, bandwidth shares and admission count: the weight files by the form's format; a format
    without a rule gives no figure (None), never one computed from zero bytes."""
    from harness.artifact import ModelFile, ModelRef
    from harness.engines import weight_bytes, weight_files, weight_paths
    f = [ModelFile(path="ov/model.xml", size=10, sha256="a" * 64), ModelFile(path="ov/model.bin", size=90, sha256="b" * 64)]
    ir = ModelRef(name="m", form="ov-int8", source={}, format="openvino-ir", dtype="int8", parameters=1, files=f)
    assert weight_files(ir) is None and weight_bytes(ir) is None
    gguf = ModelRef(name="m", form="f", source={}, format="gguf", dtype="q8_0", parameters=1,
                    files=[ModelFile(path="m.weights", size=7, sha256="c" * 64)])
    assert weight_bytes(gguf) == 7  # a GGUF form is its file, whatever it is called
    hf = ModelRef(name="m", form="hf", source={}, format="safetensors", dtype="float32", parameters=1,
                  files=[*f, ModelFile(path="hf/model.safetensors", size=5, sha256="d" * 64)])
    assert [x.path for x in weight_files(hf)] == ["hf/model.safetensors"]
    # the derived formats' rules are their engines' (onnxruntime-genai, executorch), declared on their classes
    assert weight_paths("onnx", ["o/model.onnx", "o/model.onnx.data", "o/genai_config.json"]) == \
        ["o/model.onnx", "o/model.onnx.data"]
    assert weight_paths("pte", ["p/model.pte", "p/params.json"]) == ["p/model.pte"]
    assert weight_paths("none", ["x"]) == [] and weight_paths("toy", ["x"]) is None


def test_a_form_axis_is_no_mixing_of_weights():
    """Each cell of a form axis loads its own file: only two file sets within one (arm, cell) are pooled."""
    from types import SimpleNamespace as NS

    from harness.analysis import mixed_builds

    def run(cell, sha):
        return NS(grid=NS(arm="a", cell=cell), engine=NS(build={"binary_sha256": "e" * 64}),
                  model=NS(files=[NS(sha256=sha)]))
    assert mixed_builds([run("form=q8_0", "1" * 64), run("form=q4_0", "2" * 64)]) == []
    assert "2 different model file sets" in mixed_builds([run("form=q8_0", "1" * 64), run("form=q8_0", "2" * 64)])[0]


# ---- the core contract and its capabilities ------------------------------------------------------------------

def _members(cls: type) -> set[str]:
    return {k for k in vars(cls) if not k.startswith("_")}


def undeclared(cls: type) -> list[tuple[str, list[str]]]:
    """The capabilities whose members an engine class (or a class it inherits, the capabilities aside) sets
    without declaring them: the pipeline would read the capability's defaults and never see its values."""
    from harness.engines.capabilities import CAPABILITIES
    out = []
    for cap in CAPABILITIES:
        own = sorted({k for klass in cls.__mro__ if klass not in CAPABILITIES and klass is not object
                      for k in vars(klass) if k in _members(cap)})
        if own and not issubclass(cls, cap):
            out.append((cap.__name__, own))
    return out


def test_the_core_contract_has_at_most_15_members_and_the_rest_are_capabilities():
    from harness.engines.base import Engine
    from harness.engines.capabilities import CAPABILITIES
    core = _members(Engine)
    assert len(core) <= 15, sorted(core)
    for cap in CAPABILITIES:
        assert not core & _members(cap), (cap.__name__, core & _members(cap))


def test_every_engine_declares_the_capabilities_it_sets():
    from harness.engines import ENGINES, engine_class
    assert {name: undeclared(engine_class(name)) for name in ENGINES} == {name: [] for name in ENGINES}
    # and a class that sets a capability's member without declaring it is caught
    from harness.engines.base import Engine
    from harness.engines.capabilities import Limits

    class Quiet(Engine):
        max_batch = None  # would be ignored: the pipeline reads capability(engine, Limits).max_batch

    class Declared(Engine, Limits):
        max_batch = None
    assert undeclared(Quiet) == [("Limits", ["max_batch"])] and undeclared(Declared) == []


def test_an_engine_without_a_capability_gets_its_defaults():
    from harness.engines import get_engine
    from harness.engines.capabilities import Fidelity, IsaCap, Limits, Patches, Sizing, capability, has
    cmd = get_engine("command")
    assert has(cmd, Limits) and not has(cmd, Sizing) and not has(cmd, IsaCap)
    assert capability(cmd, Sizing).admission("m", {}, None, {}, 256) is None
    assert capability(cmd, Sizing).sizes_by_admission({}) is False
    assert capability(cmd, IsaCap).isa_record("avx2", {}, {})["status"] == "not emulated: the command engine has no ISA switch"
    assert capability(cmd, Fidelity).reference_form is None
    with pytest.raises(UserError, match="command: has no fidelity mode"):
        capability(cmd, Fidelity).fidelity_command(Path("m"), 1, [0], None, Path("r"), Path("o"), Path("w"))
    with pytest.raises(UserError, match="the command engine has no runtime patches"):
        capability(cmd, Patches).validate_patches("g.yaml", "arms[a].patches", "none")
    vllm = get_engine("vllm")
    assert capability(vllm, Sizing) is vllm and capability(vllm, Patches) is vllm


TOY = {
    "__init__.py": '''
from harness.engines.base import Engine, failed
from harness.engines.capabilities import Limits


class Toy(Engine, Limits):
    """An engine of a new on-disk format (toy-*), made from a model's hf-fp32 by its own converter."""
    name = "toy"
    default_form = "toy-copy"
    form_prefix = "toy-"
    form_maker = "toy_engine.forms"  # the capability the zoo reaches through the registry
    weight_files = {"toy": (".json",)}  # which of its form's files hold the weights
    metrics = ("wall_s",)

    def engine_info(self):
        return {"name": "toy", "version": "0", "build_commit": "n/a", "build": {}}

    def run(self, ctx, form):
        return failed("failed", "a toy", [], {})
''',
    "forms.py": '''
FORMS = {"toy-copy": "the model's config, copied"}


def recipe(form):
    return {"converter": "copy", "version": 1}


def build(hf_dir, out, form):
    out.mkdir(parents=True)
    (out / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    return {"path": f"{out.name}/config.json", "format": "toy", "dtype": "float32", "from": "hf-fp32",
            "recipe": recipe(form)}
''',
}


def test_an_engine_of_a_new_format_is_one_package_and_one_registry_line(tmp_path, monkeypatch):
    """docs/engines.md's walk-through, as the code is: the package (its class and its form maker) and one line
    in ENGINES; the zoo derives its forms and a grid plans an arm of it, with no other module touched."""
    import sys

    from harness import engines, grid, models
    pkg = tmp_path / "toy_engine"
    pkg.mkdir()
    for name, text in TOY.items():
        (pkg / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    caches = (engines.engine_class, engines.form_makers, models.derived_forms, engines.weight_rules)

    def clear():
        for c in caches:
            c.cache_clear()
    monkeypatch.setitem(engines.ENGINES, "toy", "toy_engine:Toy")  # the one registry line
    clear()
    try:
        maker = models.derived_forms()["toy-copy"]
        assert maker.__name__ == "toy_engine.forms" and maker.recipe("toy-copy") == {"converter": "copy", "version": 1}
        doc = {"name": "g", "model": "tiny-llama", "arms": [{"name": "t", "engine": "toy"}], "threads": 1,
               "workload": {"prompt_len": 8, "context_len": 16, "gen_len": 4}}
        spec = grid.from_dict(doc, "g.yaml", "0" * 64)
        assert grid.model_forms(spec) == {"tiny-llama": ["toy-copy"]}
        assert engines.weight_paths("toy", ["toy-copy/config.json", "x.bin"]) == ["toy-copy/config.json"]
        with pytest.raises(UserError, match="toy needs a toy-\\* form"):
            engines.get_engine("toy").check("tiny-llama", "gguf-f32")
    finally:
        monkeypatch.delitem(engines.ENGINES, "toy")
        clear()
        for m in ("toy_engine", "toy_engine.forms"):
            sys.modules.pop(m, None)
    assert "toy-copy" not in models.derived_forms()
