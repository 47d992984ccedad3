"""`harness report --html DIR`: the report's pages as static HTML, opened in headless Chromium (Debian's chromium
package): no script error, every plot drawn with data, a screenshot taken."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.paths import PROJECT_ROOT

GRIDS = ("quickstart-fleet", "decode-threads", "four-bit")  # a ratio chart, a thread sweep (two hosts' series), 30+ rows


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    from harness.cli import main
    tmp = tmp_path_factory.mktemp("html")
    for g in GRIDS:
        shutil.copytree(PROJECT_ROOT / "artifacts" / g, tmp / "store" / g)
    out = tmp / "site"
    assert main(["report", "--store", str(tmp / "store"), "--html", str(out)]) == 0
    return out


def test_every_page_is_there_linked_and_self_contained(rendered):
    names = sorted(p.name for p in rendered.iterdir())
    assert names == sorted(["index.html", "plotly.min.js", *(f"{g}.html" for g in GRIDS)])
    index = (rendered / "index.html").read_text()
    for g in GRIDS:
        assert f'href="{g}.html"' in index
        page = (rendered / f"{g}.html").read_text()
        assert 'href="index.html"' in page and ".md\"" not in page
        assert "<img" not in page and 'class="plot"' in page  # every plot interactive, none a PNG
        assert not re.search(r'src="https?://', page)  # nothing fetched from the network
    assert "<table>" in index and "harness report: a grid's page" not in (rendered / f"{GRIDS[0]}.html").read_text()


def test_a_grid_page_opens_with_the_answer_and_folds_the_rest(rendered):
    page = (rendered / f"{GRIDS[0]}.html").read_text()
    assert '<nav class="contents">' in page
    folds = re.findall(r'<details id="section-\d+"( open)?><summary><h2>(.*?)</h2>', page)
    assert folds[0] == (" open", "The answer") and len(folds) > 1
    assert all(not opened for opened, _ in folds[1:])  # per-host tables, warnings and method: folded
    assert page.index("The answer") < page.index('class="plot"')


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium; make's setup installs it where it can)")
    return exe


def _open(exe: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={page.parent.parent / 'chromium-profile'}", "--virtual-time-budget=10000", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("page", ["index", *GRIDS])
def test_pages_render_in_headless_chromium(rendered, page):
    exe = _chromium()
    path = rendered / f"{page}.html"
    r = _open(exe, path, "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stdout[:2000]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("errors") == "0", attrs
    expected = len(re.findall(r'class="plot"', path.read_text()))
    assert attrs.get("plots") == str(expected), attrs  # every plot drawn, each with data
    assert attrs.get("labels-missing", "0") == "0", attrs  # every row of every forest plot has its label drawn
    if page != "index":
        assert expected >= 1
    shot = rendered / f"{page}.png"
    r = _open(exe, path, f"--screenshot={shot}", "--window-size=1200,1600")
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    shot.unlink()


def test_a_page_from_hostile_strings_and_broken_figures_stays_inert():
    """Markup in a store's strings is text, never HTML; a NaN in a figure is a gap, never invalid JSON; a `</script>`
    inside a figure's data cannot end its script element."""
    from harness import html
    fig = {"data": [{"type": "scatter", "x": [1.0, float("nan")], "y": [float("inf"), 2.0], "name": "</script><b>x"}],
           "layout": {}}
    page = html.page_html("t", "# t\n\nerror: <script>alert(1)</script>\n\n![p.png](p.png)\n", {"p.png": fig})
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page
    data = page.split('id="plot-1-data">')[1].split("</script>")[0]
    import json
    assert json.loads(data.replace("<\\/", "</"))["data"][0]["x"] == [1.0, None]
