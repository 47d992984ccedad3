"""Grid parsing, validation messages, pure expansion and balanced interleaving."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import grid, schedule
from harness.errors import UserError

from conftest import COMMAND_GRID


def _spec(**over):
    doc = {"name": "g", "arms": [{"name": "a", "engine": "command", "options": {"cmd": "true"}},
                                 {"name": "b", "engine": "command", "options": {"cmd": "true"}}],
           "workload": {"prompt_len": 8, "context_len": 16, "gen_len": 4}, "threads": 1, "passes": 4}
    doc.update(over)
    return grid.from_dict(doc, "g.yaml", "0" * 64)


def test_load_and_expand(write_grid):
    spec = grid.load(write_grid(COMMAND_GRID))
    cells = grid.expand(spec)
    assert len(cells) == 1 and cells[0].params["prompt_len"] == 1
    assert len(spec.sha256) == 64


@pytest.mark.parametrize("missing", ["prompt_len", "context_len", "gen_len"])
def test_workload_shape_has_no_default(missing):
    wl = {"prompt_len": 8, "context_len": 16, "gen_len": 4}
    del wl[missing]
    with pytest.raises(UserError) as e:
        _spec(workload=wl)
    msg = str(e.value)
    assert f"workload.{missing}" in msg and "no default" in msg and "wrong conclusion" in msg and "g.yaml" in msg


def test_axis_may_supply_workload():
    spec = _spec(workload={"context_len": 64, "gen_len": 4}, axes={"prompt_len": [8, 16]})
    assert [c.params["prompt_len"] for c in grid.expand(spec)] == [8, 16]


def test_unknown_engine_lists_known():
    with pytest.raises(UserError) as e:
        _spec(arms=[{"name": "x", "engine": "tensorrt"}])
    assert "arms[0].engine" in str(e.value) and "llama.cpp" in str(e.value) and "vllm" in str(e.value)


def test_unknown_axis_and_field():
    with pytest.raises(UserError, match=r"axes.flavour: unknown axis.*threads"):
        _spec(axes={"flavour": [1]})
    with pytest.raises(UserError, match=r"pases: unknown field"):
        _spec(pases=3)


def test_unknown_arm_in_rule_lists_arms():
    with pytest.raises(UserError, match=r"exclude\[0\].arm: unknown arm 'zz'.*arms: a, b"):
        _spec(exclude=[{"arm": "zz"}])


def test_unknown_baseline_and_order():
    with pytest.raises(UserError, match="baseline"):
        _spec(baseline="zzz")
    with pytest.raises(UserError, match="order.*interleaved"):
        _spec(order="zigzag")


def test_yaml_object_tags_refused(write_grid):
    p = write_grid("name: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(UserError, match="invalid YAML"):
        grid.load(p)


def test_exclude_and_include():
    spec = _spec(axes={"threads": [1, 2], "prompt_len": [8, 16]}, exclude=[{"threads": 2, "prompt_len": 16}])
    assert len(grid.expand(spec)) == 3
    spec = _spec(axes={"threads": [1, 2]}, exclude=[{"threads": 2, "arm": "b"}])
    cells = grid.expand(spec)
    assert [a.name for a in grid.arms_for(spec, cells[1])] == ["a"]
    spec = _spec(axes={"threads": [1, 2, 4]}, include=[{"threads": 4}])
    assert [c.params["threads"] for c in grid.expand(spec)] == [4]


def test_two_arm_abba():
    runs = schedule.schedule(_spec(passes=4))
    orders = [[r.arm for r in runs if r.pass_index == p] for p in range(4)]
    assert orders == [["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]]


@settings(max_examples=60, deadline=None)
@given(n_arms=st.integers(1, 5), passes=st.integers(1, 12), n_threads=st.integers(1, 3),
       order=st.sampled_from(grid.ORDERS), seed=st.integers(0, 1000))
def test_every_cell_arm_once_per_pass(n_arms, passes, n_threads, order, seed):
    arms = [{"name": f"arm{i}", "engine": "command", "options": {"cmd": "true"}} for i in range(n_arms)]
    spec = _spec(arms=arms, passes=passes, axes={"threads": list(range(1, n_threads + 1))}, order=order, seed=seed)
    runs = schedule.schedule(spec)
    cells = grid.expand(spec)
    assert len(runs) == len(cells) * n_arms * passes
    c = Counter((r.cell.id, r.arm, r.pass_index) for r in runs)
    assert set(c.values()) == {1}
    assert [r.index for r in runs] == list(range(len(runs)))
    for p in range(passes):
        assert sorted(r.position for r in runs if r.pass_index == p) == list(range(len(cells) * n_arms))
    assert schedule.schedule(spec) == runs  # deterministic for a seed


@settings(max_examples=40, deadline=None)
@given(n_arms=st.integers(2, 6), blocks=st.integers(1, 3), seed=st.integers(0, 100))
def test_interleaving_is_balanced(n_arms, blocks, seed):
    """Over whole blocks of the design each arm goes first equally often."""
    block = 4 if n_arms == 2 else (n_arms if n_arms % 2 == 0 else 2 * n_arms)
    orders = schedule.arm_orders(n_arms, block * blocks, seed)
    firsts = Counter(o[0] for o in orders)
    assert set(firsts.values()) == {block * blocks // n_arms} and len(firsts) == n_arms
    assert all(sorted(o) == list(range(n_arms)) for o in orders)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_williams_carryover_balance(n):
    rows = schedule.williams(n)
    pairs = Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
    assert len(set(pairs.values())) == 1 and len(pairs) == n * (n - 1)


# ---- the engine contract at plan time: nothing runs ------------------------------------------------------

CONTRACT_GRID = """
name: contract
model: smollm2-135m
arms:
  - {{name: cpp, engine: llama.cpp, form: gguf-f32}}
  - {{name: late, engine: vllm, form: hf-fp32, options: {options}}}
workload: {{prompt_len: 8, context_len: 256, gen_len: 4}}
threads: 2
"""


@pytest.mark.parametrize("options,expected", [
    ("{dtype: float32, turbo: true}", "arms[late].options.turbo: unknown option"),
    ("{eager: sometimes}", "arms[late].options.eager: invalid value 'sometimes'"),
    ("{max_num_seqs: 0}", "arms[late].options.max_num_seqs: invalid value 0"),
    ("{engine_core: threads}", "arms[late].options.engine_core: invalid value 'threads'"),
])
def test_plan_refuses_bad_engine_options_before_anything_runs(write_grid, cli, tmp_path, options, expected):
    g = write_grid(CONTRACT_GRID.format(options=options))
    rc, out, err = cli("plan", g)
    assert rc == 2 and expected in err and str(g) in err and len(err.strip().splitlines()) == 1
    rc, out, err = cli("run", g, "--store", tmp_path / "store")
    assert rc == 2 and expected in err and not (tmp_path / "store").exists()


def test_plan_refuses_batch_an_engine_cannot_run(cli, write_grid):
    g = write_grid("""
        name: b
        arms: [{name: a, engine: command, options: {cmd: "true"}}]
        workload: {prompt_len: 1, context_len: 1, gen_len: 1}
        axes: {batch: [1, 2]}
        threads: 1
    """)
    rc, _, err = cli("plan", g)
    assert rc == 2 and "axes.batch: 2 concurrent requests asked of arm 'a', but command runs at most 1" in err


def test_llama_bench_refuses_warmups_it_cannot_do_and_batch():
    arms = [{"name": "lb", "engine": "llama-bench", "form": "gguf-f32"}]
    base = {"name": "g", "model": "smollm2-135m", "arms": arms, "threads": 2,
            "workload": {"prompt_len": 8, "context_len": 256, "gen_len": 4}}
    with pytest.raises(UserError, match=r"warmups: 3 asked of arm 'lb', but llama-bench can do 0 or 1"):
        grid.from_dict({**base, "warmups": 3}, "g.yaml", "0" * 64)
    with pytest.raises(UserError, match=r"workload.batch: 4 concurrent requests"):
        grid.from_dict({**base, "workload": {**base["workload"], "batch": 4}}, "g.yaml", "0" * 64)


def test_llamacpp_context_must_be_what_it_uses():
    arms = [{"name": "cpp", "engine": "llama.cpp", "form": "gguf-f32"}]
    with pytest.raises(UserError, match=r"workload.context_len: 300 .* would use 512"):
        grid.from_dict({"name": "g", "model": "smollm2-135m", "arms": arms, "threads": 2,
                        "workload": {"prompt_len": 8, "context_len": 300, "gen_len": 4}}, "g.yaml", "0" * 64)


def test_exclude_keeps_an_arm_out_of_cells_it_cannot_run():
    arms = [{"name": "cpp", "engine": "llama.cpp", "form": "gguf-f32"},
            {"name": "lb", "engine": "llama-bench", "form": "gguf-f32"}]
    spec = grid.from_dict({"name": "g", "model": "smollm2-135m", "arms": arms, "threads": 2, "axes": {"batch": [1, 2]},
                           "exclude": [{"arm": "lb", "batch": 2}],
                           "workload": {"prompt_len": 8, "context_len": 256, "gen_len": 4}}, "g.yaml", "0" * 64)
    assert len(grid.expand(spec)) == 2


def test_every_engine_implements_the_contract():
    from harness.engines import ENGINES, get_engine
    from harness.engines.base import Engine
    for name in ENGINES:
        e = get_engine(name)
        assert isinstance(e, Engine) and e.name == name and e.metrics
        assert e.Options.model_config.get("extra") == "forbid"
    from harness.metrics import NAMES
    assert set(NAMES) <= set(get_engine("llama.cpp").metrics) and set(NAMES) <= set(get_engine("vllm").metrics)
    assert not set(NAMES) & set(get_engine("llama-bench").metrics)  # its own figures, its own names


def test_model_axis_runs_each_cell_on_its_model(tmp_path):
    from harness import execute
    from harness.store import Store
    spec = _spec(axes={"model": ["tiny-llama", "smollm2-135m"]}, passes=1)
    assert spec.model == "tiny-llama"
    cells = grid.expand(spec)
    assert sorted(grid.model_of(spec, c.params) for c in cells) == ["smollm2-135m", "tiny-llama"]
    g = tmp_path / "m.yaml"
    g.write_text("name: m\narms:\n  - {name: a, engine: command, options: {cmd: 'true'}}\n"
                 "workload: {prompt_len: 1, context_len: 1, gen_len: 1}\nthreads: 1\npasses: 1\nrepetitions: 1\n"
                 "warmups: 0\naxes: {model: [tiny-llama, smollm2-135m]}\n")
    execute.run_grid(str(g), store_root=tmp_path / "store")
    arts = [a for a in Store(tmp_path / "store").load_grid("m")]
    assert sorted(a.grid.cell_params["model"] for a in arts) == ["smollm2-135m", "tiny-llama"]


def test_model_axis_errors():
    with pytest.raises(UserError, match=r"axes.model\[0\]: unknown model 'nope'"):
        _spec(axes={"model": ["nope"]})
    with pytest.raises(UserError, match="both as the grid's model and as an axis"):
        _spec(model="tiny-llama", axes={"model": ["tiny-llama"]})
