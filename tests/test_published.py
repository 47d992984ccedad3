"""The published store: every committed artifact passes `harness check`; results.md is what it regenerates."""

from pathlib import Path

from harness.paths import PROJECT_ROOT


def test_committed_artifacts_pass_check(cli, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    rc, out, err = cli("check", "artifacts", "baselines")
    assert rc == 0, out


def test_results_md_is_up_to_date(cli, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    rc, out, err = cli("report", "--check", "--out", "reports/results.md")
    assert rc == 0, out


def test_report_check_fails_when_store_changes(cli, tmp_path, monkeypatch):
    import shutil
    monkeypatch.chdir(PROJECT_ROOT)
    shutil.copytree("artifacts", tmp_path / "artifacts")
    out_file = tmp_path / "results.md"
    rc, _, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file)
    assert rc == 0
    rc, _, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file, "--check")
    assert rc == 0
    arts = sorted(Path(tmp_path / "artifacts").rglob("*.json"))
    if arts:
        arts[0].unlink()  # an artifact removed without re-rendering
        rc, out, _ = cli("report", "--store", tmp_path / "artifacts", "--out", out_file, "--check")
        assert rc == 1 and "stale" in out


def test_report_on_a_missing_store_is_a_usage_error(cli, tmp_path):
    out = tmp_path / "results.md"
    out.write_text("kept")
    rc, _, err = cli("report", "--store", tmp_path / "nope", "--out", out)
    assert rc == 2 and "--store" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "kept"
