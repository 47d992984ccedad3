"""Histories (harness/analysis/history.py): versions as arms, steps between consecutive versions found by paired
intervals at a family's level; and a planted step in a real history of `command` arms, found at its place."""

import hashlib
import json
import re
from types import SimpleNamespace as NS

import numpy as np
import pytest

from harness.analysis.history import histories

ORDER = ("v1", "v2", "v3", "v4", "v5")


def _runs(levels: dict[str, float], passes: int, noise: float, rng) -> list:
    """Fake runs of a history: per pass a shared drift (what pairing by pass removes) and each version's level."""
    out = []
    for p in range(passes):
        drift = rng.normal(0, 0.05)
        for i, (v, level) in enumerate(levels.items()):
            x = level * np.exp(drift + rng.normal(0, noise))
            out.append(NS(status="ok", grid=NS(arm=v, cell="batch=1,threads=1", pass_index=p),
                          timing=NS(end=f"2026-01-01T00:{p:02d}:{i:02d}"),
                          metrics={"wall_s": NS(samples=[x, x, x], unit="s", higher_is_better=False)}))
    return out


def test_a_planted_step_is_found_at_its_place_and_nowhere_else():
    rng = np.random.default_rng(1)
    levels = {"v1": 0.10, "v2": 0.10, "v3": 0.105, "v4": 0.105, "v5": 0.105}
    (h,) = histories(_runs(levels, 10, 0.005, rng), ORDER)
    assert [p.version for p in h.points] == list(ORDER) and len(h.steps) == 4
    found = [(s.before, s.after, s.verdict) for s in h.steps if s.found]
    assert found == [("v2", "v3", "worse")]  # 5% more time: worse, at v2 -> v3 only
    step = next(s for s in h.steps if s.after == "v3")
    assert step.comparison.ci_low > 1 and step.comparison.m_family == 4  # one family: every step shown


def test_a_flat_history_shows_a_step_at_most_at_the_stated_rate():
    """Fifty-step families of flat histories: the share with any step found stays under 0.05 (Bonferroni over
    the family: conservative)."""
    rng = np.random.default_rng(2)
    flat = {v: 0.1 for v in ORDER}
    trials = 300
    false = sum(any(s.found for h in histories(_runs(flat, 8, 0.02, rng), ORDER) for s in h.steps)
                for _ in range(trials))
    assert false / trials <= 0.05, false


def test_too_few_passes_say_the_history_is_too_noisy_to_tell():
    rng = np.random.default_rng(3)
    (h,) = histories(_runs({v: 0.1 for v in ORDER}, 3, 0.02, rng), ORDER)
    assert all(not s.comparison.has_interval and s.verdict.startswith("undetermined") for s in h.steps)


def test_a_version_a_series_did_not_measure_is_skipped_not_compared():
    rng = np.random.default_rng(4)
    runs = [a for a in _runs({v: 0.1 for v in ORDER}, 8, 0.01, rng) if a.grid.arm != "v3"]
    (h,) = histories(runs, ORDER)
    assert [(s.before, s.after) for s in h.steps] == [("v1", "v2"), ("v2", "v4"), ("v4", "v5")]


def test_a_real_planted_history_is_found_and_reported(tmp_path, cli):
    """The history-planted grid, shortened: five `command` versions, the fifth slower by a third; run for real,
    its page names the step."""
    import yaml

    from harness.paths import PROJECT_ROOT
    doc = yaml.safe_load((PROJECT_ROOT / "grids" / "history-planted.yaml").read_text())
    for a in doc["arms"]:
        # a step of 0.25 s: under the suite's load a process spawn alone varies by a tenth of a second
        a["options"]["cmd"] = "sleep 0.3" if a["name"] in ("v4", "v5") else "sleep 0.05"
        a.pop("cpus")
    doc |= {"passes": 12, "repetitions": 1, "warmups": 0}  # 8 reach a family of 4 steps' level; 12 bear a stall
    grid = tmp_path / "history-planted.yaml"
    grid.write_text(yaml.safe_dump(doc))
    store = tmp_path / "store"
    assert cli("run", grid, "--store", store)[0] == 0
    (tmp_path / "site").mkdir()
    rc, _, err = cli("report", "--store", store, "--out", tmp_path / "site" / "results.md")
    assert rc == 0, err
    page = (tmp_path / "site" / "history-planted.md").read_text()
    assert "### History: v1 → v2 → v3 → v4 → v5" in page
    assert "- wall_s at context_len=1,gen_len=1,prompt_len=1,threads=1: v3 to v4, " in page and ", worse" in page.split("Steps found:")[1].split("####")[0]
    (png,) = re.findall(r"\(([^()]+-history\.png)\)", page)
    assert (tmp_path / "site" / png).is_file()


def _git(tree, *args):
    import subprocess
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_bisect_finds_the_commit_that_planted_a_slowdown(tmp_path, cli, monkeypatch):
    """A small git tree of six commits whose program sleeps longer from the fourth on: bisect, from the first
    (good) to the sixth (bad), names the fourth, measuring three commits a probe."""
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    tree.mkdir()
    _git(tree, "init", "-q")
    for k in range(1, 7):
        # a step beyond spawn noise and the suite's stalls (as the release bisect's below)
        (tree / "work.sh").write_text(f"sleep {0.8 if k >= 4 else 0.05}\n# commit {k}\n")
        _git(tree, "add", "work.sh")
        _git(tree, "commit", "-q", "-m", f"commit {k}")
    grid = tmp_path / "prog.yaml"
    grid.write_text("name: prog\narms:\n  - {name: prog, engine: command, options: {cmd: \"sh {tree}/work.sh\"}}\n"
                    "workload: {prompt_len: 1, context_len: 1, gen_len: 1}\nthreads: 1\nrepetitions: 1\nwarmups: 0\n")
    # at the 0.002 level a flat half steps by chance at most twice in a thousand probes; 18 passes bear stalls
    rc, out, err = cli("bisect", grid, "--tree", tree, "--good", "HEAD~5", "--bad", "HEAD", "--metric", "wall_s",
                       "--passes", "18", "--alpha", "0.002", "--store", tmp_path / "store")
    assert rc == 0, err
    assert "first bad commit: " in out and out.split("first bad commit: ")[1].split("\n")[0].endswith(" commit 4"), out
    assert err.count("[bisect] probe ") == 2  # six commits: two probes of three
    rc, out, _ = cli("bisect", grid, "--tree", tree, "--good", "HEAD~5", "--bad", "HEAD~3", "--metric", "wall_s",
                     "--passes", "18", "--alpha", "0.002", "--store", tmp_path / "store")
    assert rc == 1 and out.startswith("not separated: neither half steps"), out  # commits 1-3: no change


def test_bisect_over_releases_stops_each_probe_at_the_first_look_that_steps(tmp_path, cli, monkeypatch):
    """Releases instead of commits (`--versions`, the arm's options naming {version}): six releases of a program
    that sleeps longer from 1.0.4 on; bisect names 1.0.4, and with --until-step each probe's passes are sequential
    (passes: {until: step}): it stops at its first planned look where a half steps, long before its 18 passes."""
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    versions = [f"1.0.{k}" for k in range(1, 7)]
    for k, v in enumerate(versions, 1):  # a step no stall of the suite's load reaches: a stall in a fast run of
        # 0.25 s once made a probe's first look miss and run all its passes (a fresh clone's `make test`)
        (tmp_path / f"work-{v}.sh").write_text(f"sleep {0.8 if k >= 4 else 0.05}\n")
    grid = tmp_path / "prog.yaml"
    grid.write_text(f"name: prog\narms:\n  - {{name: prog, engine: command, options: {{cmd: \"sh {tmp_path}/work-"
                    "{version}.sh\"}}\nworkload: {prompt_len: 1, context_len: 1, gen_len: 1}\nthreads: 1\n"
                    "repetitions: 1\nwarmups: 0\n")
    store = tmp_path / "store"
    rc, out, err = cli("bisect", grid, "--versions", ",".join(versions), "--metric", "wall_s", "--passes", "18",
                       "--alpha", "0.002", "--until-step", "--store", store)
    assert rc == 0 and out.startswith("first bad release: 1.0.4"), (out, err)
    assert "what changed" not in out  # no llama-cpp-python release: no vendored trees to compare
    assert err.count("[bisect] probe ") == 2 and "the history steps at" in err and ": stopping" in err
    for k in (1, 2):  # each probe stopped at a look: fewer runs than 3 arms x 18 passes
        runs = list((store / f"prog-bisect-{k}").glob("*.json"))
        assert 0 < len(runs) < 3 * 18, (k, len(runs))
        # the rule its looks stopped on is recorded, for the report to read the history as the runner did
        stop = json.loads(runs[0].read_text())["grid"]["stop"]
        assert stop == {"until": "step", "alpha": 0.002, "metrics": ["wall_s"]}, stop
        # the probe's grid is made under the cache: each artifact names the committed template it was made from
        made = json.loads(runs[0].read_text())["grid"]["derived_from"]
        assert made["path"] == str(grid) and made["sha256"] == hashlib.sha256(grid.read_bytes()).hexdigest()
        assert made["by"].startswith(f"harness bisect --versions: prog-bisect-{k} of r") and made["by"].endswith(
            ", r5-1.0.6"), made  # the probe and the releases it measured
    rc, _, err = cli("bisect", grid, "--versions", "1.0.1", "--metric", "wall_s", "--store", store)
    assert rc == 2 and "--versions: must list two or more" in err
    rc, _, err = cli("bisect", grid, "--tree", tmp_path, "--versions", "1.0.1,1.0.2", "--metric", "wall_s")
    assert rc == 2 and "give --tree DIR --good A --bad B" in err


@pytest.mark.parametrize("extra, says", [
    ("", "passes.until: step stops when the grid's history shows a step, and it declares none"),
    ("report: {history: [a, b]}\n", "passes.until: step waits on a step of the history's primary metrics"),
])
def test_until_step_needs_a_history_and_its_primary_metrics(tmp_path, cli, extra, says):
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\narms:\n  - {name: a, engine: command, options: {cmd: \"true\"}}\n"
                    "  - {name: b, engine: command, options: {cmd: \"true\"}}\n"
                    "workload: {prompt_len: 1, context_len: 1, gen_len: 1}\nthreads: 1\n"
                    "passes: {until: step, max: 20}\n" + extra)
    rc, _, err = cli("plan", grid)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    grid.write_text(grid.read_text() + ("report: {history: [a, b]}\n" if not extra else "")
                    + "primary: {metrics: [wall_s]}\n")
    rc, out, err = cli("plan", grid)
    assert rc == 0 and "shows a step on a primary metric" in out, err
    assert "history steps: sequential" in out and "(as 1 at 0.05)" in out, out


def test_a_step_family_at_another_level_is_scaled_up_never_down(tmp_path, cli):
    """3 steps at 0.03 are a family of 5 at 0.05 (ceil: rounding would give 5 here but 4 for 2.4); a level outside
    [1e-6, 0.5) is refused, in a grid and on bisect's command line."""
    from harness.sequential import scaled
    assert scaled(3, 0.03) == 5 and scaled(2, 0.0417) == 3 and scaled(4, 0.05) == 4 and scaled(1, 0.2) == 1
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\narms:\n  - {name: a, engine: command, options: {cmd: \"true\"}}\n"
                    "  - {name: b, engine: command, options: {cmd: \"true\"}}\n"
                    "workload: {prompt_len: 1, context_len: 1, gen_len: 1}\nthreads: 1\n"
                    "report: {history: [a, b]}\nprimary: {metrics: [wall_s]}\n"
                    "passes: {until: step, max: 20, alpha: 1.0e-9}\n")
    rc, _, err = cli("plan", grid)
    assert rc == 2 and "passes.alpha: must be a level in [1e-06, 0.5)" in err, err
    rc, _, err = cli("bisect", grid, "--versions", "1,2", "--metric", "wall_s", "--alpha", "0")
    assert rc == 2 and "--alpha must be a level in [1e-06, 0.5)" in err, err
    rc, _, err = cli("bisect", grid, "--versions", "1,2", "--metric", "wall_s", "--passes", "1")
    assert rc == 2 and "--passes must be 2 to" in err, err


@pytest.mark.parametrize("made", ["grids/x.yaml", "{path: g.yaml, sha256: abc, by: me}",
                                  "{path: g.yaml, sha256: " + "0" * 64 + "}"])
def test_a_made_grids_origin_that_is_not_path_sha256_and_by_is_one_line(tmp_path, cli, made):
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\narms:\n  - {name: a, engine: command, options: {cmd: 'true'}}\nworkload: {prompt_len: 1, "
                    f"context_len: 1, gen_len: 1}}\nthreads: 1\nderived_from: {made}\n")
    rc, out, err = cli("plan", grid)
    assert rc == 2 and "derived_from" in err and len(err.strip().splitlines()) == 1, err


def test_a_probes_history_stands_where_its_grid_file_is_gone():
    """A bisect probe's grid lives in the cache of whoever ran it: on another machine its page still shows the
    history, the arms in the order harness bisect numbered them (reports/llamacpp-tg-q4_0-bisect-*.md)."""
    from harness import views
    spec = views.probe_history("llamacpp-tg-q4_0-bisect-1", ["r4-0.3.20", "r0-0.3.16", "r2-0.3.18"])
    assert spec is not None and spec.history == ("r0-0.3.16", "r2-0.3.18", "r4-0.3.20")
    assert views.probe_history("x-bisect-2", ["c10-abcdef0", "c2-1234567"]).history == ("c2-1234567", "c10-abcdef0")
    assert views.probe_history("quickstart", ["r0-0.3.16", "r2-0.3.18"]) is None  # not a probe
    assert views.probe_history("x-bisect-1", ["r0-a", "vllm-fp32"]) is None  # an arm bisect did not name
    assert views.probe_history("x-bisect-1", ["r0-a", "c0-b"]) is None  # one index twice
