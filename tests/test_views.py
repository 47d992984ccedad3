"""What a grid's report shows is declared in its grid file (`report:`, harness/views.py), never by grid name in
the report's code; the report is an index and a page per grid, written whole and checked page by page."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
import yaml

from harness import report, views
from harness.grid import read_yaml
from harness.paths import PROJECT_ROOT

GRID = """
name: v
arms:
  - {name: a, engine: command, options: {cmd: "true"}}
  - {name: b, engine: command, options: {cmd: "true"}}
workload: {prompt_len: 1, context_len: 1, gen_len: 1}
threads: 1
passes: 2
"""


def _grid_names() -> set[str]:
    out = set()
    for p in (PROJECT_ROOT / "grids").glob("*.yaml"):
        doc = yaml.safe_load(p.read_text())
        out |= {p.stem, doc.get("name", p.stem)}
    return out


def test_report_code_names_no_grid():
    """No string in harness/report/ is a committed grid's name: a grid's views are declared in its file."""
    names = _grid_names() - {"fidelity"}  # also the word for an artifact kind and a build's gate
    assert {"quickstart", "runtime-decode", "step-attribution"} <= names
    report_modules = [f"report/{p.name}" for p in sorted((PROJECT_ROOT / "harness" / "report").glob("*.py"))]
    for mod in (*report_modules, "views.py", "summary.py"):
        tree = ast.parse((PROJECT_ROOT / "harness" / mod).read_text())
        found = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)} & names
        assert not found, f"harness/{mod} names grids {sorted(found)}: declare them in the grid files' report: field"


def test_committed_grids_declare_what_the_report_used_to_name():
    """The views the report gave by name before are in the grid files: targets, ceiling grids, docs' blocks."""
    spec = {p.stem: views.of_series(read_yaml(p)[0].get("name", p.stem), str(p), read_yaml)
            for p in (PROJECT_ROOT / "grids").glob("*.yaml") if read_yaml(p)[0].get("kind", "speed") == "speed"}
    assert not [k for k, (_, problem) in spec.items() if problem]
    assert {k for k, (s, _) in spec.items() if s.targets} == {"runtime-decode", "decode-compiled", "decode-target"}
    assert {k for k, (s, _) in spec.items() if s.ceiling} == {"llamacpp-baseline", "vllm-vs-llamacpp", "decode-threads",
                                                               "hardware-ladder", "step-attribution"}
    assert {k for k, (s, _) in spec.items() if "runtime" in s.blocks} >= {"runtime-decode", "step-attribution"}


@pytest.mark.parametrize("field,expected", [
    ("report: [scale]", "report: must be a mapping"),
    ("report: {view: [scale]}", "report.view: unknown field"),
    ("report: {views: [speed]}", "report.views: unknown 'speed'"),
    ("report: {ceiling: yes please}", "report.ceiling: must be true or false"),
    ("report: {blocks: [published]}", "report.blocks: unknown 'published'"),
    ("report: {targets: [{issue: '#1', metric: m, against: a, at_least: 0.5, arms: [c]}]}",
     "report.targets[0].arms: names no arm of this grid: 'c'"),
    ("report: {targets: [{issue: '#1', metric: m, against: a, at_least: .nan, arms: [b]}]}",
     "report.targets[0].at_least"),
    ("report: {targets: [{issue: '#1', metric: m, against: a, arms: [b]}]}", "report.targets[0].at_least: missing"),
])
def test_plan_refuses_a_malformed_report_field_in_one_line(write_grid, cli, tmp_path, field, expected):
    g = write_grid(GRID + field + "\n")
    rc, _, err = cli("plan", g)
    assert rc == 2 and expected in err and str(g) in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli("run", g, "--store", tmp_path / "store")
    assert rc == 2 and not (tmp_path / "store").exists()


def _golden(tmp_path: Path, monkeypatch, field: str = "") -> Path:
    """The golden store and its grid file in a folder of the test's own (the report reads the file's `report:`)."""
    d = tmp_path / "g"
    shutil.copytree(PROJECT_ROOT / "tests" / "golden", d)
    if field:
        (d / "golden.yaml").write_text((d / "golden.yaml").read_text() + field)
    monkeypatch.chdir(d)
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    return d


def test_the_report_shows_what_the_series_grid_file_declares(tmp_path, monkeypatch):
    """A target declared in the golden grid's file appears on its page; a malformed field warns and falls back;
    the memoized report is not reused once the grid file changed."""
    _golden(tmp_path, monkeypatch)
    plain = report.build_all(["store"])[0]
    assert "Targets (generated from the series" not in plain["golden.md"]
    Path("golden.yaml").write_text(Path("golden.yaml").read_text() + (
        "report:\n  targets:\n    - {issue: '#0', metric: wall_s, against: fast, at_least: 0.4, arms: [slow]}\n"))
    pages = report.build_all(["store"])[0]  # the same store: only the grid file changed
    assert "Targets (generated from the series" in pages["golden.md"]
    assert "slow / fast wall_s:" in pages["golden.md"] and "(#0)" in pages["golden.md"]
    Path("golden.yaml").write_text(Path("golden.yaml").read_text().replace("at_least: 0.4", "at_least: -1"))
    bad = report.build_all(["store"])[0]["golden.md"]
    assert "Targets (generated" not in bad and "report.targets[0].at_least" in bad and "views are the defaults" in bad


def test_index_and_a_page_per_grid_written_whole_and_checked(tmp_path, monkeypatch, cli):
    d = _golden(tmp_path, monkeypatch)
    out = d / "rep"
    out.mkdir()
    victim = tmp_path / "victim.md"
    victim.write_text("not the report's\n")
    (out / "golden.md").symlink_to(victim)  # a link where a page goes is replaced, never written through
    rc, stdout, err = cli("report", "--store", "store", "--out", out / "results.md")
    assert rc == 0, err
    assert victim.read_text() == "not the report's\n" and not (out / "golden.md").is_symlink()
    index = (out / "results.md").read_text()
    assert "[golden.md](golden.md)" in index and "## golden on host" not in index
    assert "## golden on host" in (out / "golden.md").read_text()
    assert cli("report", "--store", "store", "--out", out / "results.md", "--check")[0] == 0
    # a stale page, a missing one, a page of a grid the store no longer holds: each fails the check
    (out / "golden.md").write_text("edited\n")
    rc, stdout, _ = cli("report", "--store", "store", "--out", out / "results.md", "--check")
    assert rc == 1 and f"{out / 'golden.md'}: stale" in stdout
    (out / "golden.md").unlink()
    assert cli("report", "--store", "store", "--out", out / "results.md", "--check")[0] == 1
    cli("report", "--store", "store", "--out", out / "results.md")
    (out / "gone.md").write_text(report.PAGE_MARK + "\n# gone\n")
    (out / "notes.md").write_text("# the user's own notes\n")
    rc, stdout, _ = cli("report", "--store", "store", "--out", out / "results.md", "--check")
    assert rc == 1 and "gone.md" in stdout and "notes.md" not in stdout
    cli("report", "--store", "store", "--out", out / "results.md")
    assert not (out / "gone.md").exists() and (out / "notes.md").exists()


def test_page_names_are_plain_files_beside_the_index():
    taken: set[str] = set()
    assert report.page_name("quickstart", taken) == "quickstart.md"
    for hostile in ("../x", "results", "a/b", ".hidden", "x" * 300, "QUICKSTART"):
        name = report.page_name(hostile, taken)
        assert name.startswith("grid-") and "/" not in name and name.endswith(".md")


def test_verdict_prints_the_pages_verdicts_and_writes_nothing(tmp_path, monkeypatch, cli):
    d = _golden(tmp_path, monkeypatch)
    before = sorted(p.name for p in d.iterdir())
    rc, out, _ = cli("report", "--store", "store", "--verdict", "golden")
    lines = out.strip().splitlines()
    assert rc == 0 and lines[0].startswith("golden on host f407ce910eeb (6 passes; family: 2 comparison(s)")
    assert len(lines) == 3 and all(ln.startswith("  slow / fast wall_s at threads=") for ln in lines[1:])
    assert all("undetermined: 6 passes cannot give a 97.5% interval" in ln for ln in lines[1:])
    assert sorted(p.name for p in d.iterdir()) == before
    rc, _, err = cli("report", "--store", "store", "--verdict", "nope")
    assert rc == 2 and "--verdict: no series of this grid" in err


def test_report_code_computes_no_statistics():
    """harness/report/ words what the analysis modules computed (analysis, summary, targets, stats' verdicts):
    of harness/stats.py it reads only the level's wording and the Comparison type; no numpy, scipy or statistics."""
    tree = ast.parse("\n".join(p.read_text() for p in sorted((PROJECT_ROOT / "harness" / "report").glob("*.py"))))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "stats"}
    assert used <= {"level_text", "Comparison"}, used
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"numpy", "scipy", "statistics"}, imported
