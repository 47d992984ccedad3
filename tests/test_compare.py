"""`harness compare A B`: the exact unpaired interval (its null distribution against scipy's, its coverage by
simulation), matching by cell, arm and metric, refusal of mismatched definitions, and the command on the published
two-host quickstart series, on two arms of one series (paired) and on two versions of one grid."""

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from harness import compare, execute, stats
from harness.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
STORE = str(ROOT / "artifacts")


@pytest.mark.parametrize("m,n", [(1, 1), (2, 3), (5, 5), (4, 9), (8, 7)])
def test_mann_whitney_distribution_is_scipys_exact_one(m, n):
    cdf = stats.mann_whitney_cdf(m, n)
    assert len(cdf) == m * n + 1 and cdf[-1] == pytest.approx(1.0)
    rng = np.random.default_rng(m * 100 + n)
    for _ in range(5):  # the one-sided exact p-value P(U <= u) at the observed U of random samples
        x, y = rng.normal(size=m), rng.normal(size=n) + 0.5
        u = sps.mannwhitneyu(x, y, alternative="less", method="exact")
        assert cdf[int(u.statistic)] == pytest.approx(u.pvalue, rel=1e-9)


def test_the_unpaired_interval_covers_a_planted_ratio_at_its_level():
    """2000 pairs of series, lognormal run values with a planted ratio of 1.07 (the spread of runs on this kind of
    machine, 5%): the interval holds 1.07 at least at its achieved level (less a Monte Carlo margin), and the
    estimate is centred on it."""
    rng = np.random.default_rng(20261201)
    for n_a, n_b, m_family in ((6, 6, 1), (8, 10, 3)):
        hits, ests, achieved = 0, [], None
        for _ in range(2000):
            a = np.exp(rng.normal(0, 0.05, n_a))
            b = 1.07 * np.exp(rng.normal(0, 0.05, n_b))
            c = stats.compare_unpaired(list(b), list(a), m_family=m_family)
            assert c.has_interval and c.ci_low <= c.ratio <= c.ci_high
            hits += c.ci_low <= 1.07 <= c.ci_high
            ests.append(c.ratio)
            achieved = c.achieved
        assert achieved >= 1 - 0.05 / m_family
        assert hits / 2000 >= achieved - 3 * np.sqrt(achieved * (1 - achieved) / 2000), (n_a, n_b, hits)
        assert abs(np.median(ests) - 1.07) < 0.005


def test_too_few_runs_or_a_bad_value_give_no_verdict():
    c = stats.compare_unpaired([1.0, 1.1], [2.0, 2.1], m_family=9)
    assert not c.has_interval and "run at least 6 passes on each side" in stats.unpaired_verdict(c, True)
    c = stats.compare_unpaired([1.0, float("nan"), 1.2], [2.0, 2.1, 2.2])
    assert stats.unpaired_verdict(c, True).startswith("undetermined: a run value is not a finite positive")


def test_two_hosts_of_the_quickstart_unpaired(cli):
    # the same grid version on both hosts (series 2; host 3891360811dc's newest is series 3)
    rc, out, err = cli("compare", "quickstart@f407ce910eeb", "quickstart@3891360811dc#631d", "--store", STORE, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    rows = doc["comparisons"]
    assert {r["arm"] for r in rows} == {"llama.cpp", "vllm"} and all(r["method"].startswith("unpaired") for r in rows)
    assert doc["a"]["host"] == "f407ce910eeb" and doc["b"]["host"] == "3891360811dc"
    assert all(r["level"] == pytest.approx(1 - 0.05 / len(rows)) for r in rows)
    # two passes a side: the ratio, no interval, and the verdict says how many passes would give one
    assert all(r["ci_low"] is None and "run at least" in r["verdict"] for r in rows)
    # the newest series timed llama.cpp by the request loop, series 2 by llama-bench: refused, both named
    rc, _, err = cli("compare", "quickstart@f407ce910eeb", "quickstart@3891360811dc", "--store", STORE)
    assert rc == 2 and "definitions differ" in err and "llama-bench" in err and "per request" in err


def test_an_avx2_and_an_avx512_host_of_the_quickstart_unpaired_with_intervals(cli):
    # the newest series of each (the same grid version: 6 passes, one definition per metric): ratios with intervals
    rc, out, err = cli("compare", "quickstart@3891360811dc", "quickstart@8945a29942f3", "--store", STORE,
                       "--metric", "decode_tok_s", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["a"]["grid_sha256"] == doc["b"]["grid_sha256"], "the two hosts' newest series are one grid version"
    rows = doc["comparisons"]
    assert {r["arm"] for r in rows} == {"llama.cpp", "vllm"} and all(r["method"].startswith("unpaired") for r in rows)
    assert all(r["level"] == pytest.approx(1 - 0.05 / 2) for r in rows)
    assert all(r["ci_low"] is not None and r["ci_low"] <= r["ratio"] <= r["ci_high"] for r in rows), rows
    assert all(r["verdict"] in ("better", "worse") or r["verdict"].startswith("no difference") for r in rows), rows
    rc, out, _ = cli("compare", "quickstart@3891360811dc", "quickstart@8945a29942f3", "--store", STORE,
                     "--metric", "decode_tok_s")
    assert rc == 0 and "llama.cpp" in out and "vllm" in out and "[" in out


def test_two_arms_of_one_series_paired_and_mismatched_definitions_refused(cli):
    rc, out, err = cli("compare", "vllm-vs-llamacpp@3891360811dc/llama.cpp-f32", "vllm-vs-llamacpp@3891360811dc/vllm-fp32",
                       "--store", STORE, "--metric", "decode_tok_s", "--json")
    assert rc == 0, err
    rows = json.loads(out)["comparisons"]
    assert rows and all(r["method"].startswith("paired by pass") and r["ci_low"] is not None for r in rows)
    assert all(r["verdict"] in ("better", "worse") or r["verdict"].startswith("no difference") for r in rows)
    # quickstart series 2's llama.cpp arm ran llama-bench's definitions: not one measurement with vLLM's
    rc, _, err = cli("compare", "quickstart@3891360811dc#631d/llama.cpp", "quickstart@3891360811dc#631d/vllm",
                     "--store", STORE)
    assert rc == 2 and "definitions differ" in err and "llama-bench" in err and len(err.strip().splitlines()) == 1
    # series 3 (6 passes, one definition per metric): the demo's comparison, paired, with its interval
    rc, out, err = cli("compare", "quickstart@3891360811dc/llama.cpp", "quickstart@3891360811dc/vllm", "--store", STORE,
                       "--metric", "decode_tok_s", "--json")
    assert rc == 0, err
    (row,) = json.loads(out)["comparisons"]
    assert row["method"].startswith("paired by pass") and row["ci_low"] < row["ratio"] < row["ci_high"] < 1
    assert row["verdict"] == "worse"
    runs = _runs(STORE)
    for spec, want in (("quickstart", "3 hosts measured it"), ("no-such", "no runs of grid"),
                       ("quickstart@3891360811dc#ffff", "match #ffff"), ("bad spec!", "not a series"),
                       ("quickstart@3891360811dc/nope", "no ok run of arm 'nope'")):
        with pytest.raises(UserError, match=re.escape(want)):
            compare.resolve(spec, runs)
    with pytest.raises(UserError, match="one side names an arm"):
        compare.compare(compare.resolve("quickstart@3891360811dc/vllm", runs), compare.resolve("quickstart@f407ce910eeb", runs))


GRID = """
name: cmpv
description: {desc}
arms:
  - {{name: a, engine: command, options: {{cmd: "true"}}}}
  - {{name: b, engine: command, options: {{cmd: "true"}}}}
workload: {{prompt_len: 1, context_len: 1, gen_len: 1}}
threads: 1
passes: 2
repetitions: 1
warmups: 0
"""


def test_two_versions_of_one_grid_by_sha(cli, tmp_path):
    g, store = tmp_path / "cmpv.yaml", tmp_path / "store"
    shas = []
    for desc in ("first", "second"):
        g.write_text(textwrap.dedent(GRID.format(desc=desc)))
        assert execute.run_grid(str(g), store_root=store, new_series=desc == "second").failed == 0
        shas.append(max((json.loads(p.read_text()) for p in (store / "cmpv").glob("*.json")),
                        key=lambda d: d["timing"]["end"])["grid"]["sha256"])
    assert shas[0] != shas[1]
    rc, out, err = cli("compare", f"cmpv#{shas[0][:8]}", f"cmpv#{shas[1][:8]}", "--store", store)
    assert rc == 0, err
    assert f"grid sha256 {shas[0][:12]}" in out and f"grid sha256 {shas[1][:12]}" in out
    assert out.count("| wall_s |") == 2 and "unpaired (2 vs 2 runs)" in json.dumps(
        compare.compare(*(compare.resolve(f"cmpv#{s[:8]}", _runs(store)) for s in shas)))


def _runs(store):
    from harness import report
    return report.collect([str(store)]).runs


def test_fail_on_worse_gates_a_verdict_of_worse_and_nothing_else(cli):
    """The CI gate: exit 1 when a compared or declared comparison is worse (by at least --min-effect with its
    interval's confidence), 0 otherwise; the published quickstart's vLLM decodes worse than llama.cpp."""
    a, b = "quickstart@3891360811dc/llama.cpp", "quickstart@3891360811dc/vllm"
    rc, out, err = cli("compare", a, b, "--metric", "decode_tok_s", "--fail-on", "worse")
    assert rc == 1 and "| worse |" in out and "fail-on worse: decode_tok_s" in err
    rc, out, _ = cli("compare", b, a, "--metric", "decode_tok_s", "--fail-on", "worse")
    assert rc == 0 and "| better |" in out  # the same pair the other way round
    rc, _, _ = cli("compare", a, b, "--metric", "decode_tok_s")
    assert rc == 0  # without the gate a finding is printed, not an exit status
    # a minimum effect: worse by at least 30% holds (upper bound 0.535), by at least 50% is not shown
    assert cli("compare", a, b, "--metric", "decode_tok_s", "--fail-on", "worse", "--min-effect", "0.3")[0] == 1
    assert cli("compare", a, b, "--metric", "decode_tok_s", "--fail-on", "worse", "--min-effect", "0.5")[0] == 0
    # the report's verdicts of a grid's newest series, every host
    rc, _, err = cli("report", "--verdict", "quickstart", "--fail-on", "worse")
    assert rc == 1 and "host 3891360811dc: vllm decode_tok_s" in err
    rc, _, err = cli("report", "--verdict", "quickstart", "--fail-on", "worse", "--min-effect", "0.9")
    assert rc == 0
    rc, _, err = cli("report", "--fail-on", "worse")
    assert rc == 2 and "add --verdict GRID" in err
