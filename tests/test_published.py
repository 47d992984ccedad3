"""The published store: every committed artifact passes `harness check`; results.md is what it regenerates."""

from pathlib import Path

from harness.paths import PROJECT_ROOT


def test_committed_artifacts_pass_check(cli, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    rc, out, err = cli("check", "artifacts", "baselines")
    assert rc == 0, out


def test_results_md_and_readme_figures_are_up_to_date(cli, monkeypatch):
    """results.md and the README's published block are exactly what the store renders: a figure typed
    into the README block, or one the store no longer gives, fails here."""
    monkeypatch.chdir(PROJECT_ROOT)
    rc, out, err = cli("report", "--check", "--out", "reports/results.md", "--readme", "README.md",
                       "--readme", "docs/methodology.md", "--readme", "docs/runtime.md",
                       "--readme", "docs/hardware.md")
    assert rc == 0, out


def test_a_readme_figure_that_differs_from_the_store_fails(cli, tmp_path, monkeypatch):
    from harness.report.readme import README_BEGIN
    monkeypatch.chdir(PROJECT_ROOT)
    text = Path("README.md").read_text()
    block = text.split(README_BEGIN)[1]
    figure = next(tok for tok in block.split() if tok.replace(".", "").isdigit() and "." in tok)
    edited = tmp_path / "README.md"
    edited.write_text(text.replace(figure, str(float(figure) + 1.0), 1))
    rc, out, _ = cli("report", "--check", "--out", "reports/results.md", "--readme", edited)
    assert rc == 1 and f"{edited}: stale" in out
    rc, _, err = cli("report", "--check", "--out", "reports/results.md", "--readme", tmp_path / "none.md")
    assert rc == 2 and "--readme" in err


def test_report_check_fails_when_store_changes(cli, tmp_path, monkeypatch):
    import shutil
    monkeypatch.chdir(PROJECT_ROOT)
    for grid in ("quickstart", "vllm-vs-llamacpp"):  # two grids of the published store: what --check compares
        shutil.copytree(Path("artifacts") / grid, tmp_path / "artifacts" / grid)  # is the same for any store
    out_file = tmp_path / "results.md"
    rc, _, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file)
    assert rc == 0
    rc, _, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file, "--check")
    assert rc == 0
    arts = sorted(Path(tmp_path / "artifacts").rglob("*.json"))
    assert arts, "the published store is empty"
    arts[0].unlink()  # an artifact removed without re-rendering
    rc, out, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file, "--check")
    assert rc == 1 and "stale" in out


def test_report_on_a_missing_store_is_a_usage_error(cli, tmp_path):
    out = tmp_path / "results.md"
    out.write_text("kept")
    rc, _, err = cli("report", "--store", tmp_path / "nope", "--out", out)
    assert rc == 2 and "--store" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "kept"


def test_the_readme_opens_with_the_answer_per_host():
    """Before any set-up or usage: one generated line per host of the summary, each naming the engine and form that
    decode fastest, its ratio to the reference and the verdict."""
    from harness.report.readme import block_markers
    text = (PROJECT_ROOT / "README.md").read_text()
    begin, end = block_markers("answer")
    assert text.index(begin) < text.index("## Two commands")
    lines = [ln for ln in text.split(begin)[1].split(end)[0].splitlines() if ln.startswith("- **ISA tier ")]
    hosts = {ln.split("(host `")[1].split("`")[0] for ln in lines}
    summary = text.split("## The summary")[1]
    assert hosts and hosts == {h.split("`")[0] for h in summary.split("**Host `")[1:]}
    assert all(" decodes fastest on " in ln and "tok/s" in ln for ln in lines)
