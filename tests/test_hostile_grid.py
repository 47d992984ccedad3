"""Issue 30, "plan refuses what cannot run": hostile or broken grid files are refused with one UserError line
(exit 2 from the CLI), never a traceback, a hang or a silently wrong grid. Every test here runs in well under
a second and starts no engine."""

from __future__ import annotations

import math
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import grid, hardware, schedule
from harness.errors import UserError

GRID = """\
name: g
arms:
  - {name: a, engine: command, options: {cmd: "true"}}
  - {name: b, engine: command, options: {cmd: "true"}}
workload: {prompt_len: 8, context_len: 16, gen_len: 4}
threads: 1
passes: 4
"""


def _doc(**over):
    doc = {"name": "g", "arms": [{"name": "a", "engine": "command", "options": {"cmd": "true"}},
                                 {"name": "b", "engine": "command", "options": {"cmd": "true"}}],
           "workload": {"prompt_len": 8, "context_len": 16, "gen_len": 4}, "threads": 1, "passes": 4}
    doc.update(over)
    return doc


def _spec(**over):
    """from_dict as load() calls it: with this machine's CPUs (the fixtures below pretend other machines)."""
    return grid.from_dict(_doc(**over), "g.yaml", "0" * 64, cpus=grid.machine_cpus())


def _arm(**over):
    return _spec(arms=[{"name": "a", "engine": "command", "options": {"cmd": "true"}, **over}])


def _load(tmp_path, text, name="g.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return grid.load(p)


def _refused(tmp_path, text, *fragments):
    """load() refuses with one line holding every fragment; returns the message."""
    with pytest.raises(UserError) as e:
        _load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def _one_line_exit_2(cli, path, *fragments):
    rc, out, err = cli("plan", path)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


# ---- 1. duplicate keys ---------------------------------------------------------------------------------

def test_duplicate_key_refused_with_both_lines(tmp_path):
    _refused(tmp_path, GRID + "passes: 40\n", "duplicate key 'passes'", "lines 7 and 8", "g.yaml")


def test_duplicate_key_in_a_nested_flow_mapping_refused(tmp_path):
    text = GRID.replace('{name: b, engine: command,', '{name: b, engine: command, name: c,')
    _refused(tmp_path, text, "duplicate key 'name'", "lines 4 and 4")


def test_duplicate_key_via_cli_is_exit_2_one_line(tmp_path, cli):
    p = tmp_path / "g.yaml"
    p.write_text(GRID.replace("threads: 1\n", "threads: 1\nthreads: 2\n"))
    _one_line_exit_2(cli, p, "duplicate key 'threads'")


def test_merge_key_override_is_not_a_duplicate(tmp_path):
    text = ("name: g\narms:\n  - &a {name: a, engine: command, options: {cmd: 'true'}}\n"
            "  - {<<: *a, name: b}\nworkload: {prompt_len: 8, context_len: 16, gen_len: 4}\nthreads: 1\n")
    spec = _load(tmp_path, text)
    assert [a.name for a in spec.arms] == ["a", "b"] and spec.arms[1].options == {"cmd": "true"}


# ---- 2. alias bombs, size, depth -----------------------------------------------------------------------

LAUGHS = "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def test_billion_laughs_refused_fast(tmp_path):
    text = GRID + "description: &a lol\n" + "workload_x:\n" + "".join("  " + line + "\n" for line in
                                                                     LAUGHS.splitlines())
    t = time.process_time()
    _refused(tmp_path, text, "more than 100,000 values once its aliases are expanded")
    assert time.process_time() - t < 1.0


def test_too_many_aliases_refused(tmp_path):
    text = GRID.replace("prompt_len: 8", "prompt_len: &p 8")
    text += "include: [" + ", ".join(["{prompt_len: *p}"] * (grid.MAX_ALIASES + 1)) + "]\n"
    _refused(tmp_path, text, f"more than {grid.MAX_ALIASES} aliases", "line 8")


def test_recursive_alias_refused(tmp_path):
    _refused(tmp_path, GRID + "primary: &r {cells: [*r]}\n", "nested deeper than")


def test_deep_nesting_refused_without_recursion_error(tmp_path):
    _refused(tmp_path, GRID + "description: " + "[" * 2000 + "]" * 2000 + "\n", "nested deeper than 32 levels")


def test_file_over_the_size_limit_refused(tmp_path):
    _refused(tmp_path, GRID + "#" * grid.MAX_GRID_BYTES + "\n", f"larger than {grid.MAX_GRID_BYTES} bytes")


def test_fifo_and_directory_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        grid.load(fifo)  # no writer: a blocking open would hang here
    with pytest.raises(UserError, match="not a regular file"):
        grid.load(tmp_path)


def test_integer_literal_python_cannot_read_refused(tmp_path):
    _refused(tmp_path, GRID.replace("passes: 4", "passes: " + "9" * 5000), "invalid YAML value")


def test_python_tags_and_odd_scalar_types_refused(tmp_path):
    _refused(tmp_path, GRID.replace("threads: 1", "threads: !!binary aGVsbG8="), "bytes", "threads")
    _refused(tmp_path, GRID.replace("threads: 1", "seed: 2001-12-14\nthreads: 1"), "date", "seed")
    _refused(tmp_path, GRID + "description: {yes: 1}\n", "key True is not a string")


# ---- 3. non-finite numbers and booleans where numbers are meant ----------------------------------------

NUMERIC_PLACES = [("passes: 4", "passes: {v}"), ("threads: 1", "threads: {v}"),
                  ("passes: 4", "passes: 4\nwarmups: {v}"), ("passes: 4", "passes: 4\nrepetitions: {v}"),
                  ("passes: 4", "passes: 4\ntimeout_s: {v}"), ("passes: 4", "passes: 4\nseed: {v}"),
                  ("prompt_len: 8", "prompt_len: {v}"), ("context_len: 16", "context_len: {v}"),
                  ("gen_len: 4", "gen_len: {v}"), ("gen_len: 4", "gen_len: 4, batch: {v}"),
                  ("passes: 4", "passes: 4\naxes: {threads: [1, {v}]}"),
                  ("passes: 4", "passes: 4\naxes: {replicate: [{v}]}"),
                  ("{name: a, engine: command,", "{name: a, threads: {v}, engine: command,"),
                  ("{name: a, engine: command,", "{name: a, cpus: [{v}], engine: command,"),
                  ("{name: a, engine: command,", "{name: a, numa: {v}, engine: command,"),
                  ('options: {cmd: "true"}}\n  - {name: b', 'options: {cmd: "true", threads: {v}}}\n  - {name: b'),
                  ("passes: 4", "passes: 4\nexclude: [{threads: {v}}]")]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "true", "false", "1.5"])
@pytest.mark.parametrize("old,new", NUMERIC_PLACES, ids=range(len(NUMERIC_PLACES)))
def test_non_finite_and_boolean_numbers_refused(tmp_path, old, new, value):
    assert old in GRID
    text = GRID.replace(old, new.replace("{v}", value), 1)
    if value == "1.5" and ("timeout_s" in new):
        _load(tmp_path, text)  # a fractional timeout is a number of seconds
        return
    _refused(tmp_path, text)


def test_passes_true_is_refused_not_one(tmp_path):
    _refused(tmp_path, GRID.replace("passes: 4", "passes: true"), "passes: must be an integer >= 1, got True")


def test_non_finite_inside_engine_options_refused(tmp_path):
    _refused(tmp_path, GRID.replace('cmd: "true"}}\n  - {name: b', 'cmd: "true", x: .nan}}\n  - {name: b'),
             "arms[0].options.x: nan is not a finite number")


def test_non_finite_and_boolean_timeout_refused_in_from_dict():
    for bad in (math.nan, math.inf, True, 0, -1, grid.MAX_TIMEOUT_S + 1, "10"):
        with pytest.raises(UserError, match="timeout_s"):
            _spec(timeout_s=bad)
    assert _spec(timeout_s=2.5).timeout_s == 2.5
    with pytest.raises(UserError, match="seed: must be an integer, got True"):
        _spec(seed=True)


def test_rule_value_true_is_not_threads_1():
    with pytest.raises(UserError, match=r"exclude\[0\].threads: must be an integer"):
        _spec(exclude=[{"threads": True}])
    with pytest.raises(UserError, match=r"primary.cells\[0\].prompt_len"):
        _spec(primary={"cells": [{"prompt_len": math.nan}]})


# ---- 4. sizes that would hang the plan -----------------------------------------------------------------

def test_a_billion_passes_refused_fast_with_the_numbers(tmp_path, cli):
    p = tmp_path / "g.yaml"
    p.write_text(GRID.replace("passes: 4", "passes: 1000000000"))
    t = time.process_time()
    err = _one_line_exit_2(cli, p, "1 cells (no axes) x 2 arms x 1,000,000,000 passes = 2,000,000,000 runs",
                           f"more than the {grid.MAX_RUNS:,}", "split it")
    assert time.process_time() - t < 1.0, err


def test_two_million_runs_refused_before_expansion(monkeypatch):
    monkeypatch.setattr(grid.cells, "expand", lambda spec: pytest.fail("expanded"))
    with pytest.raises(UserError) as e:
        _spec(passes=1, axes={"prompt_len": list(range(1, 1001)), "gen_len": list(range(1, 1001))})
    msg = str(e.value)
    assert "1,000,000 cells (1000 gen_len x 1000 prompt_len) x 2 arms x 1 passes = 2,000,000 runs" in msg


def test_too_many_cells_refused_before_expansion(monkeypatch):
    monkeypatch.setattr(grid.cells, "expand", lambda spec: pytest.fail("expanded"))
    with pytest.raises(UserError, match=r"axes: 200 gen_len x 100 prompt_len = 20,000 cells, more than the 10,000"):
        _spec(passes=1, arms=[{"name": "a", "engine": "command", "options": {"cmd": "true"}}],
              axes={"prompt_len": list(range(1, 101)), "gen_len": list(range(1, 201))})


def test_a_grid_at_the_limits_plans_in_seconds():
    spec = _spec(passes=5, axes={"prompt_len": list(range(1, 101)), "gen_len": list(range(1, 101))})
    t = time.process_time()  # this process's CPU time: other work on a loaded machine does not count
    runs = schedule.schedule(spec)
    schedule.format_plan(spec, runs)
    assert len(runs) == grid.MAX_RUNS and time.process_time() - t < 3.0


def test_many_passes_within_the_limit_plan_fast():
    # two arms: the signed-rank distribution of 2000 passes is cubic to build; arm orders per pass quadratic
    spec = _spec(passes=2000)
    t = time.process_time()
    runs = schedule.schedule(spec)
    text = schedule.format_plan(spec, runs)
    assert len(runs) == 4000 and "warning" not in text and time.process_time() - t < 1.0


def test_rules_times_cells_bounded():
    with pytest.raises(UserError, match="rule checks, more than"):
        _spec(passes=1, axes={"prompt_len": list(range(1, 101)), "gen_len": list(range(1, 101))},
              exclude=[{"prompt_len": 1, "gen_len": g} for g in range(1, 101)])
    with pytest.raises(UserError, match=f"more than {grid.MAX_RULES}"):
        _spec(include=[{"prompt_len": 8}] * (grid.MAX_RULES + 1))
    with pytest.raises(UserError, match=f"more than the {grid.MAX_ARMS} a grid may compare"):
        _spec(passes=1, arms=[{"name": f"a{i}", "engine": "command", "options": {"cmd": "true"}}
                              for i in range(grid.MAX_ARMS + 1)])


def test_duplicate_axis_values_refused():
    with pytest.raises(UserError, match=r"axes.threads: 1 is listed twice"):
        _spec(axes={"threads": [1, 1]})


# ---- 5. CPUs and threads this machine does not have ----------------------------------------------------

@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(grid, "machine_cpus", lambda: [0, 1])


@pytest.mark.usefixtures("two_cpus")
@pytest.mark.parametrize("cpus,fragment", [([2], "CPU 2 not among the CPUs this process may run on (0-1"),
                                           ([0, 7, 8], "CPU 7-8 not among"), ([-1], "CPU -1 is negative"),
                                           ([1, 1], "CPU 1 is listed twice"), ([True], "non-empty list"),
                                           ([], "non-empty list"), ("0-1", "non-empty list")])
def test_cpus_the_machine_does_not_have_refused(cpus, fragment):
    with pytest.raises(UserError, match=r"arms\[0\].cpus") as e:
        _arm(cpus=cpus)
    assert fragment in str(e.value)


@pytest.mark.usefixtures("two_cpus")
def test_threads_beyond_the_machine_refused():
    assert _arm(cpus=[1], threads=1).arms[0].cpus == [1]
    with pytest.raises(UserError, match=r"arms\[a\].threads: 3 threads asked of arm 'a', but this process may run "
                                        r"on 2 CPU\(s\) \(0-1"):
        _arm(threads=3)
    with pytest.raises(UserError, match=r"axes.threads: 4 threads"):
        _spec(axes={"threads": [1, 4]})
    with pytest.raises(UserError, match=r"^g.yaml: threads: 3 threads"):
        _spec(threads=3)
    with pytest.raises(UserError, match=r"options.threads: must be an integer"):
        _arm(options={"cmd": "true", "threads": True})


def test_emulated_arms_keep_their_own_rules(monkeypatch):
    """One CPU here, an 8-core x86 profile: an arm emulating a 2-core class at 2 threads is judged by the
    class (emulate.plan), a native arm at 2 threads by this machine."""
    monkeypatch.setattr(grid, "machine_cpus", lambda: [0])
    prof = {**hardware.profile_from_class(hardware.get_class("x86-avx2-2c-4g"), "test machine"), "cores": 8,
            "cpus": list(range(8)), "memory_total_bytes": 64 << 30, "memory_available_bytes": 60 << 30}
    monkeypatch.setattr(hardware, "profile_from_probe", lambda host: dict(prof))
    spec = _arm(hardware="x86-avx2-2c-4g", threads=2)
    assert spec.arms[0].hardware == "x86-avx2-2c-4g"
    with pytest.raises(UserError, match="threads 3 exceed hardware x86-avx2-2c-4g's 2 cores"):
        _arm(hardware="x86-avx2-2c-4g", threads=3)
    with pytest.raises(UserError, match=r"arms\[a\].threads: 2 threads asked"):
        _arm(hardware="native", threads=2)


def test_committed_grid_cpus_fit_this_machine():
    """The committed grids pin CPUs 0 and 1 and use at most 2 threads; this checks the rule on this machine."""
    avail = set(grid.machine_cpus())
    if len(avail) < 2 or not {0, 1} <= avail:
        pytest.skip("this machine lets the harness run on fewer than CPUs 0 and 1")
    for g in ("grids/noise-aa.yaml", "grids/planted-interleaved.yaml", "grids/planted-sequential.yaml"):
        assert grid.load(g).arms[0].cpus


# ---- 6. environment the OS cannot take -----------------------------------------------------------------

@pytest.mark.parametrize("env,fragment", [({"": "x"}, "'' is not an environment variable name"),
                                          ({"1X": "x"}, "'1X' is not"), ({"A=B": "x"}, "'A=B' is not"),
                                          ({"A-B": "x"}, "'A-B' is not"), ({"A\0": "x"}, "is not"),
                                          ({"A": "x\0y"}, "cannot be an environment value"),
                                          ({"A": True}, "env.A: must be a string, got True"),
                                          ({"A": [1]}, "must be a string"), ({"A": math.nan}, "cannot be"),
                                          ({"A": None}, "must be a string"), ([["A", "1"]], "must be a mapping")])
def test_environment_the_os_cannot_take_refused(env, fragment):
    with pytest.raises(UserError, match=r"arms\[0\].env") as e:
        _arm(env=env)
    assert fragment in str(e.value)


def test_good_environment_accepted_and_stringified():
    assert _arm(env={"OMP_PROC_BIND": "close", "_X1": 3, "GGML_SCHED_PRIO": 0}).arms[0].env == \
        {"OMP_PROC_BIND": "close", "_X1": "3", "GGML_SCHED_PRIO": "0"}


def test_nul_in_any_string_refused(tmp_path):
    _refused(tmp_path, GRID.replace('cmd: "true"}}\n  - {name: b', 'cmd: "tr\\0ue"}}\n  - {name: b'),
             "arms[0].options.cmd: holds a NUL character")


# ---- 7. names that cannot be file names ----------------------------------------------------------------

BAD_NAMES = ["", ".", "..", "a/b", "..\\x", "a\0b", "a\nb", "a\x7fb", "-rf", "x" * 101, "é" * 51, 7, None, ["a"]]


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_grid_names_that_cannot_be_file_names_refused(name):
    with pytest.raises(UserError, match=r"^g.yaml: name: "):
        _spec(name=name)


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_arm_names_that_cannot_be_file_names_refused(name):
    with pytest.raises(UserError, match=r"arms\[0\].name: "):
        _arm(name=name)


def test_good_names_accepted():
    assert _spec(name="x" * 100).name == "x" * 100
    assert _arm(name="llama.cpp-f32 (bare)").arms[0].name == "llama.cpp-f32 (bare)"


def test_bad_grid_name_via_cli_is_exit_2_one_line(tmp_path, cli):
    p = tmp_path / "g.yaml"
    p.write_text(GRID.replace("name: g", "name: -rf"))
    _one_line_exit_2(cli, p, "name: ")


# ---- 8. wrong types: a model as a mapping, and every field fed wrong values ----------------------------

def test_model_given_as_a_mapping_is_one_line(tmp_path, cli):
    p = tmp_path / "g.yaml"
    missing = tmp_path / "missing.gguf"
    p.write_text(GRID.replace("name: g\n", f"name: g\nmodel: {{name: x, gguf: {missing}}}\n"))
    # a model by path is a grid's own (#32): a path that is not there is refused in one line, with the fix
    _one_line_exit_2(cli, p, f"model.gguf: {missing}: No such file or directory", "give an existing GGUF file")
    with pytest.raises(UserError, match=r"axes.model\[0\]: give exactly one of gguf: PATH"):  # an axis takes them too
        _spec(axes={"model": [{"name": "x"}]})
    with pytest.raises(UserError, match=r"arms\[0\].engine: unknown engine \{'x': 1\}"):
        _spec(arms=[{"engine": {"x": 1}}])


def test_string_axes_in_workload_refused_not_dropped():
    with pytest.raises(UserError, match="workload.form: unknown field.*axes.form"):
        _spec(workload={"prompt_len": 8, "context_len": 16, "gen_len": 4, "form": "gguf-f32"})


def test_falsy_wrong_types_are_not_defaults():
    for fld in ("options", "env", "observe_only"):
        with pytest.raises(UserError, match=rf"arms\[0\].{fld}"):
            _arm(**{fld: 0 if fld != "env" else []})
    with pytest.raises(UserError, match="axes: must be a mapping"):
        _spec(axes=[])


WRONG = [None, True, False, 0, -1, 2, 1.5, math.nan, math.inf, "", "x", "..", [], [1], ["x"], [None], [[1]],
         {}, {"a": 1}, {"x": {"y": []}}, [{"a": 1}], {"name": "x", "gguf": "p"}]
TOP = sorted(grid.TOP_FIELDS) + ["zzz"]
ARM = sorted(grid.ARM_FIELDS) + ["zzz"]


def _never_another_exception(build):
    try:
        build()
    except UserError as e:
        assert "\n" not in str(e)


def test_every_top_level_field_given_wrong_types_is_a_user_error():
    for f in TOP:
        for v in WRONG:
            _never_another_exception(lambda: _spec(**{f: v}))


def test_every_arm_field_given_wrong_types_is_a_user_error():
    for f in ARM:
        for v in WRONG:
            _never_another_exception(lambda: _arm(**{f: v}))
    for v in WRONG:  # an arm itself, and entries of the nested mappings
        _never_another_exception(lambda: _spec(arms=[v]))
        _never_another_exception(lambda: _spec(workload={"prompt_len": 8, "context_len": 16, "gen_len": v}))
        _never_another_exception(lambda: _spec(primary={"metrics": v}))
        _never_another_exception(lambda: _spec(primary={"cells": [{"threads": v}]}))


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**30) | st.floats() | st.text(max_size=5),
                       lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                       max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(["top", "arm", "workload", "axes"]), key=st.sampled_from(TOP + ARM), value=JSONISH)
def test_random_values_anywhere_are_user_errors(where, key, value):
    if where == "top":
        _never_another_exception(lambda: _spec(**{key: value}))
    elif where == "arm":
        _never_another_exception(lambda: _arm(**{key: value}))
    elif where == "workload":
        _never_another_exception(lambda: _spec(workload={"prompt_len": 8, "context_len": 16, "gen_len": 4,
                                                         "batch": value}))
    else:
        _never_another_exception(lambda: _spec(axes={"threads": value}))


def test_random_yaml_text_is_a_user_error(tmp_path):
    """Whatever a file holds, load() answers a GridSpec or a UserError."""
    for i, text in enumerate(["", "[", "- a", "a: [}", "? [a]\n: 1", "a: *x", "%YAML 9.9\n---\na: 1", "\ufeff",
                              "--- 1\n--- 2\n", "name: g\n\tarms: 1", "&a [*a]", "!!set {a, b}", "!!omap [a: 1]",
                              "arms: !!python/name:os.system", "passes: 0x1F", "passes: 1_000"]):
        p = tmp_path / f"t{i}.yaml"
        p.write_text(text)
        _never_another_exception(lambda: grid.load(p))
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"name: \xff\xfe")
    with pytest.raises(UserError, match="not UTF-8"):
        grid.load(p)


def test_threads_beyond_the_arms_own_cpus_refused(write_grid):
    """One thread per CPU: a run whose threads exceed its affinity is refused by check, so plan refuses it first."""
    g = write_grid("""
        name: over
        arms:
          - {name: a, engine: command, options: {cmd: "true"}, cpus: [0]}
        workload: {prompt_len: 1, context_len: 1, gen_len: 1}
        threads: 2
        passes: 1
    """)
    with pytest.raises(UserError, match=r"threads: 2 threads asked of arm 'a', but its cpus are 0 \(1 CPU"):
        grid.load(g)


def test_arm_name_with_the_run_key_separator_refused(write_grid):
    """run_key joins cell|arm|pass: an arm named 'a|0' could share a run key with another run."""
    g = write_grid("""
        name: pipes
        arms:
          - {name: "a|b", engine: command, options: {cmd: "true"}}
        workload: {prompt_len: 1, context_len: 1, gen_len: 1}
        threads: 1
        passes: 1
    """)
    with pytest.raises(UserError, match=r"arms\[0\]\.name: holds '\|'|name: holds '\|'"):
        grid.load(g)
