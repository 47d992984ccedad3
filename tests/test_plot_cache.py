"""The plot cache (harness/plotcache.py) hashes what a plot draws at the precision it is drawn: the published
store with every float moved in its last bits (what another CPU's SIMD widths do to sums and medians) leaves
plots.json unchanged and redraws nothing; a real change to the data redraws and changes it."""

import contextlib
import json
import math
import shutil
from pathlib import Path

import pytest

from harness import artifact, report
from harness.paths import PROJECT_ROOT

KINDS = ("run", "calibration")  # what the plots are drawn from; fidelity and references are looked up by id


def _floats(x, change):
    if isinstance(x, float):
        return change(x)
    if isinstance(x, dict):
        return {k: _floats(v, change) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v, change) for v in x]
    return x


def _rewrite(root: Path, change, grid: str | None = None) -> int:
    """Apply `change` to every float of the run and calibration artifacts under root (of one grid, if given);
    each gets the id of its new content (what finalize stamps; the report loads only documents whose id matches)
    and is stored under it."""
    n = 0
    for p in sorted(root.rglob("*.json")):
        doc = json.loads(p.read_text())
        if doc.get("kind") not in KINDS or (grid and doc["grid"]["name"] != grid):
            continue
        doc = _floats(doc, change)
        doc["id"] = artifact.compute_id(doc)
        p.unlink()
        (p.parent / f"{doc['id']}.json").write_text(json.dumps(doc))
        n += 1
    return n


def _last_bits(x: float) -> float:
    """x moved by two units in its last place, up or down (the direction a function of x: equal values stay equal).
    A zero stays zero: it is a count (no request met the SLO: a goodput of 0), exact on every CPU, and moved off
    zero it would be a value no run has (negative, or a ratio where there is none)."""
    if x == 0:
        return x
    to = math.inf if int(x * 1e6) % 2 else -math.inf
    return math.nextafter(math.nextafter(x, to), to)


def _render(root: Path, out: Path):
    with contextlib.chdir(root):  # the stores are named in the text as the published report names them
        _, sections, ctx = report.build_all(["artifacts", "baselines"])
    drawn, _ = report.write_plots(sections, out)
    return ctx["left_out"], drawn, (out / report.PLOT_HASHES).read_bytes()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A copy of the published stores and the plot cache it gives (started from the published plots, which it
    redraws only where they are stale)."""
    root = tmp_path_factory.mktemp("published")
    for name in ("artifacts", "baselines"):
        shutil.copytree(PROJECT_ROOT / name, root / name)
    (root / "out").mkdir()
    for p in [*(PROJECT_ROOT / "reports").glob("*.png"), PROJECT_ROOT / "reports" / report.PLOT_HASHES]:
        shutil.copy(p, root / "out")
    left_out, _, record = _render(root, root / "out")
    assert len(json.loads(record)) > 20
    return root, left_out, record


def test_last_bit_differences_leave_the_plot_cache_unchanged(published, tmp_path):
    root, left_out, record = published
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    assert _rewrite(tmp_path, _last_bits) > 1000
    new_left_out, drawn, new_record = _render(tmp_path, tmp_path / "out")
    assert new_left_out == left_out  # every perturbed artifact is read
    assert drawn == [] and new_record == record


def test_a_real_change_redraws(published, tmp_path):
    root, _, record = published
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    assert _rewrite(tmp_path, lambda x: x * 1.1, grid="decode-threads") > 0
    _, drawn, new_record = _render(tmp_path, tmp_path / "out")
    changed = {k for k, v in json.loads(new_record).items() if json.loads(record)[k] != v}
    assert changed == {p.name for p in drawn} and "decode-threads-f407ce910eeb-threads.png" in changed
