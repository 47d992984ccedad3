"""`harness export`: each format read back by the tool it is for (pandas for csv and parquet, sqlite3 for
llama-bench's SQL, llama.cpp's own compare-llama-bench.py for its JSON, pyperf for pyperf's), from the published
store; refusals in one line."""

import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import export
from harness.engines.llamacpp import build as llamacpp_build

ROOT = Path(__file__).resolve().parent.parent
STORE = str(ROOT / "artifacts")
GRID = "own-model"  # both engines, several forms, 54 runs of one host


@pytest.fixture(scope="module")
def runs():
    return export.select([STORE], [GRID])


def test_csv_and_parquet_read_back_with_one_row_per_run_and_metric(cli, tmp_path, runs):
    rc, _, err = cli("export", "--format", "csv", "--store", STORE, "--grid", GRID, "--out", tmp_path / "r.csv")
    assert rc == 0, err
    df = pd.read_csv(tmp_path / "r.csv")
    assert list(df.columns) == list(export.COLUMNS)
    assert len(df) == sum(max(1, len(a.metrics)) for a in runs) and df["id"].nunique() == len(runs)
    a = runs[0]
    row = df[(df["id"] == a.id) & (df["metric"] == "decode_tok_s")].iloc[0]
    assert json.loads(row["samples"]) == a.metrics["decode_tok_s"].samples  # every recorded value, as recorded
    assert row["host_key"] == a.host.key and row["grid_sha256"] == a.grid.sha256 and row["engine"] == a.engine.name
    rc, _, err = cli("export", "--format", "parquet", "--store", STORE, "--grid", GRID, "--out", tmp_path / "r.parquet")
    assert rc == 0, err
    pq = pd.read_parquet(tmp_path / "r.parquet")
    assert len(pq) == len(df) and list(pq[pq["id"] == a.id]["metric"]) == sorted(a.metrics)
    assert list(pq[(pq["id"] == a.id) & (pq["metric"] == "decode_tok_s")]["samples"].iloc[0]) == \
        a.metrics["decode_tok_s"].samples


def test_jsonl_to_stdout(cli, runs):
    rc, out, _ = cli("export", "--format", "jsonl", "--store", STORE, "--grid", GRID, "--engine", "vllm")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["engine"] for r in rows} == {"vllm"}
    assert len({r["id"] for r in rows}) == sum(1 for a in runs if a.engine.name == "vllm")


def test_llama_bench_json_and_sql_are_read_by_llamacpps_own_tools(cli, tmp_path, runs):
    rc, _, err = cli("export", "--format", "llama-bench-json", "--store", STORE, "--grid", GRID, "--engine", "llama.cpp",
                     "--out", tmp_path / "lb.json")
    assert rc == 0, err
    rows = json.loads((tmp_path / "lb.json").read_text())
    lc = [a for a in runs if a.engine.name == "llama.cpp" and a.status == "ok"]
    assert len(rows) == 2 * len(lc)  # a prompt-processing and a token-generation test per run
    assert [k for k in rows[0]] == [f for f, _ in export.LLAMA_BENCH_FIELDS] + ["samples_ns", "samples_ts"]
    a, pp, tg = lc[0], rows[0], rows[1]
    assert (pp["n_prompt"], pp["n_gen"]) == (a.workload.prompt_len, 0)
    assert (tg["n_prompt"], tg["n_gen"], tg["n_depth"]) == (0, a.workload.gen_len, a.workload.prompt_len)
    assert pp["samples_ts"] == a.metrics["prefill_tok_s"].samples and tg["samples_ts"] == a.metrics["decode_tok_s"].samples
    assert pp["build_commit"] == a.engine.build_commit and pp["n_threads"] == a.execution.threads
    rc, _, err = cli("export", "--format", "llama-bench-sql", "--store", STORE, "--grid", GRID, "--engine",
                     "llama.cpp", "--out", tmp_path / "lb.sql")
    assert rc == 0, err
    db = sqlite3.connect(":memory:")
    db.executescript((tmp_path / "lb.sql").read_text())
    n, avg = db.execute("SELECT COUNT(*), AVG(avg_ts) FROM llama_bench").fetchone()
    assert n == len(rows) and abs(avg - sum(r["avg_ts"] for r in rows) / len(rows)) < 1e-6 * avg
    # llama.cpp's scripts/compare-llama-bench.py (its pinned source) reads the JSON: the two forms of one build
    script = llamacpp_build.source_dir() / "scripts" / "compare-llama-bench.py"
    r = subprocess.run([sys.executable, str(script), "-i", str(tmp_path / "lb.json"), "--tool", "llama-bench",
                        "-b", a.engine.build_commit, "-c", a.engine.build_commit, "--show", "model_type"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    w = a.workload
    assert f"| pp{w.prompt_len} " in r.stdout and f"| tg{w.gen_len}@d{w.prompt_len} " in r.stdout, r.stdout[-1500:]
    assert f"t/s {a.engine.build_commit}" in r.stdout


def test_pyperf_reads_the_suite_and_compares_two_arms(cli, tmp_path, runs):
    pyperf = pytest.importorskip("pyperf", reason="the dev extra installs pyperf")
    arms = sorted({a.grid.arm for a in runs})
    files = []
    for arm in arms[:2]:
        out = tmp_path / f"{arm}.json"
        rc, _, err = cli("export", "--format", "pyperf", "--store", STORE, "--grid", GRID, "--arm", arm, "--out", out)
        assert rc == 0, err
        suite = pyperf.BenchmarkSuite.load(str(out))
        ours = [a for a in runs if a.grid.arm == arm and a.status == "ok"]
        names = suite.get_benchmark_names()
        assert names and all(arm not in n.split(" ") for n in names)  # one arm per file: names match across files
        b = next(b for b in suite.get_benchmarks() if b.get_name().endswith(" ttft_s"))
        assert b.get_unit() == "second" and b.get_nrun() == len({a.id for a in ours if a.grid.cell in b.get_name()})
        files.append(out)
    r = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", str(files[0]), str(files[1]), "--table"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "ttft_s" in r.stdout


def test_refusals_are_one_line_and_write_nothing(cli, tmp_path):
    out = tmp_path / "x.json"
    for argv, want in ((("--format", "llama-bench-json", "--grid", GRID), "different definitions"),
                       (("--format", "llama-bench-json", "--grid", GRID, "--engine", "vllm"), "no mapping onto llama-bench"),
                       (("--format", "csv", "--grid", "no-such-grid"), "no run artifact of grid no-such-grid"),
                       (("--format", "parquet", "--grid", GRID, "--out", "-"), "parquet is binary")):
        rc, _, err = cli("export", "--store", STORE, *argv, *(("--out", out) if "--out" not in argv else ()))
        assert rc == 2 and want in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    rc, _, err = cli("export", "--store", str(tmp_path / "nowhere"), "--format", "csv")
    assert rc == 2 and "not a store directory" in err


def test_out_through_a_link_replaces_the_link(cli, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    rc, _, err = cli("export", "--format", "csv", "--store", STORE, "--grid", GRID, "--out", link)
    assert rc == 0, err
    assert victim.read_text() == "keep me" and not link.is_symlink() and link.read_text().startswith("id,grid")


HOSTILE = "a|b\n<!--<script>'); DROP TABLE llama_bench;--=1+1"


def test_a_hostile_arm_name_reaches_every_export_intact(tmp_path, runs, cli):
    """An arm named to break things (a table's '|', a line break, a script block's opening, SQL, a spreadsheet
    formula) in a store that check accepts: every format reads it back, by its own tool, as it was."""
    from harness import artifact, rules
    from harness.check import check
    a = next(r for r in runs if r.engine.name == "llama.cpp" and r.status == "ok")
    doc = json.loads(Path(next(p for p in Path(STORE, GRID).rglob("*.json") if a.id in p.name)).read_text())
    doc["grid"]["arm"] = HOSTILE
    doc["grid"]["run_key"] = rules.run_key(doc["grid"]["cell"], HOSTILE, doc["grid"]["pass_index"])
    doc["id"] = artifact.compute_id(doc)
    store = tmp_path / "store" / doc["grid"]["name"]
    store.mkdir(parents=True)
    (store / f"{doc['id']}.json").write_text(json.dumps(doc))
    assert check([str(tmp_path / "store")], verify_models=False) == (1, [])
    hostile_runs = export.select([str(tmp_path / "store")], [doc["grid"]["name"]])
    for fmt in ("csv", "parquet", "jsonl"):
        out = tmp_path / f"r.{fmt}"
        out.write_bytes(export.render(fmt, hostile_runs))
        arms = (pd.read_csv(out)["arm"] if fmt == "csv" else pd.read_parquet(out)["arm"] if fmt == "parquet"
                else [json.loads(line)["arm"] for line in out.read_text().splitlines()])
        assert set(arms) == {HOSTILE}, fmt
    db = sqlite3.connect(":memory:")
    db.executescript(export.render("llama-bench-sql", hostile_runs).decode())
    assert db.execute("SELECT count(*) FROM llama_bench").fetchone()[0] >= 1  # the table survived its rows
    pp = json.loads(export.render("pyperf", hostile_runs, one_arm=True))
    assert all(isinstance(b["metadata"]["name"], str) for b in pp["benchmarks"])

    # and the report's pages: every table row keeps its header's cells; no script block is opened in the HTML
    from markdown_it import MarkdownIt
    (tmp_path / "site").mkdir()
    for where in (("--out", tmp_path / "site" / "results.md"), ("--html", tmp_path / "html")):
        rc, _, err = cli("report", "--store", tmp_path / "store", *where)
        assert rc == 0, err
    md = MarkdownIt("commonmark").enable("table")
    pages = sorted((tmp_path / "site").glob("*.md"))
    assert any("a\\|b <!--<script>" in p.read_text() for p in pages)  # escaped in its cell, whole
    for p in pages:
        tokens, cells, header = md.parse(p.read_text()), 0, None
        for t in tokens:
            if t.type == "tr_open":
                cells = 0
            elif t.type in ("th_open", "td_open"):
                cells += 1
            elif t.type == "tr_close":
                header = cells if header is None else header
                assert cells == header, (p.name, cells, header)
            elif t.type == "table_close":
                header = None
    for h in (tmp_path / "html").glob("*.html"):
        text = h.read_text()
        assert "<!--<script>" not in text and text.count("<script") == text.count("</script>"), h.name


def test_the_default_export_of_the_whole_store_loads_in_pyperf_one_definition_a_benchmark(tmp_path):
    """The newest series of each grid on each host; pyperf holds a benchmark to one host and CPU, and no benchmark
    mixes two definitions of its metric."""
    pyperf = pytest.importorskip("pyperf", reason="the dev extra installs pyperf")
    runs = export.select(None)
    out = tmp_path / "all.json"
    out.write_bytes(export.render("pyperf", runs))
    suite = pyperf.BenchmarkSuite.load(str(out))  # refuses runs of two hosts or CPUs in one benchmark
    by_id = {a.id: a for a in runs}
    for b in suite.get_benchmarks():
        ids = [r.get_metadata()["edge_harness_id"] for r in b.get_runs()]
        metric = b.get_name().split(" (")[0].split(" ")
        name = next(m for m in metric[::-1] if not m.startswith("def-"))
        assert len({by_id[i].metrics[name].definition for i in ids}) == 1, b.get_name()
        assert len({export.series_id(by_id[i]) for i in ids}) == 1, b.get_name()
    # the default is the newest series; --all-series has more, told apart by the series column
    everything = export.select(None, all_series=True)
    assert len(everything) > len(runs)
    rows = export.rows(everything)
    assert {r["series"] for r in rows} > {export.series_id(a) for a in runs}


def test_compare_llama_bench_compares_two_builds_by_the_ids_the_export_gives(tmp_path):
    """llamacpp-builds measured the pinned build and a user's tree: their ids are one length, so llama.cpp's
    compare-llama-bench.py finds each as the export gives it; cpu_info names the host."""
    from harness.engines.llamacpp.llama_bench import bench_build_id
    runs = export.select(None, ["llamacpp-builds"], engines=["llama.cpp"])
    ids = sorted({bench_build_id(a) for a in runs})
    assert len(ids) == 2 and {len(i) for i in ids} == {7}, ids
    out = tmp_path / "lb.json"
    out.write_bytes(export.render("llama-bench-json", runs))
    rows = json.loads(out.read_text())
    assert all(f"[host {r_host}" in r["cpu_info"] for r, r_host in
               zip(rows, [a.host.key for a in runs if a.status == "ok" for _ in range(2)]))
    script = llamacpp_build.source_dir() / "scripts" / "compare-llama-bench.py"
    r = subprocess.run([sys.executable, str(script), "-i", str(out), "--tool", "llama-bench", "-b", ids[0],
                        "-c", ids[1]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"t/s {ids[0]}" in r.stdout and f"t/s {ids[1]}" in r.stdout and "Speedup" in r.stdout, r.stdout[-1500:]


def test_csv_and_parquet_carry_the_load_and_typed_times(tmp_path):
    runs = export.select(None, ["serving-crosscheck"])
    df = pd.read_csv(io.BytesIO(export.render("csv", runs)))
    assert df["load_requests"].notna().all() and df["sent_rate_req_s"].notna().any()
    assert (df["series"] == [export.series_id(a) for a in runs for _ in (a.metrics or [None])]).all()
    pq = pd.read_parquet(io.BytesIO(export.render("parquet", runs)))
    assert str(pq["start"].dtype).startswith("datetime64") and str(pq["end"].dtype).startswith("datetime64")
