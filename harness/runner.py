"""The runner: executes a grid's schedule, one fresh process per run, and stores every result.

Resumable (finished runs are skipped by their run key), failed and timed-out runs are stored
with their error, and a grid whose file changed since its runs began is not mixed with them.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import artifact, emulate, grid, hardware, lifecycle, models, provenance
from harness.check import accepted, read_back_problems
from harness.engines import get_engine
from harness.engines.base import EngineResult, RunContext
from harness.errors import UserError
from harness.probe import host_key as key_of
from harness.residency import files_residency
from harness.schedule import RunSpec, schedule
from harness.store import Store, gc_paused, load_path

NO_MODEL = "none"


@dataclass
class RunSummary:
    done: int
    failed: int
    skipped: int
    store: Path
    paths: list[Path]


def existing(store: Store, spec: grid.GridSpec, new_series: bool = False,
             host_key: str | None = None, keys: set[str] | None = None) -> tuple[dict[str, list], int]:
    """Artifacts this host already stored for this grid file (same sha256), by run key, and how many
    other hosts stored. A series is (grid sha256, host key): another machine's runs never count as done
    here. This host's artifacts of another version of the grid file, and none of this one, mean the file
    changed: refused unless new_series."""
    if keys is None:  # this machine (a fleet driver passes each machine's keys)
        keys = {host_key or provenance.current_host_key()}
        # this machine emulating a class is a host of its own: its runs resume under that key
        keys |= {provenance.host_key_as(c) for c in emulated_classes(spec)}
    by_key: dict[str, list] = {}
    other_sha = set()
    other_hosts = 0
    with gc_paused():
        loaded = [(load_path(p, verify_id=True), str(p)) for p in store.iter_paths(spec.name)]
    # only what check accepts counts as done: a planted or edited "ok" artifact never stands in for a run
    arts, refused = accepted(loaded, tree_state=False)
    for line in [*store.left_out, *refused]:
        print(f"[harness] not counted as done (harness check refuses it): {line}", file=sys.stderr)
    for a in arts:
        if a.host.key not in keys:
            other_hosts += 1
            continue
        if a.grid.sha256 != spec.sha256:
            other_sha.add(a.grid.sha256)
            continue
        by_key.setdefault(a.grid.run_key, []).append(a)
    if other_sha and not by_key and not new_series:
        raise UserError(spec.path, f"grid file changed since this host's runs in {store.grid_dir(spec.name)} began "
                        f"(stored sha256 {sorted(other_sha)[0][:12]}..., now {spec.sha256[:12]}...)",
                        "restore the grid file, or pass --new-series to start a new series beside the old one")
    return by_key, other_hosts


def emulated_classes(spec: grid.GridSpec) -> set[str]:
    return {c for a in spec.arms for c in [a.hardware, *spec.axes.get("hardware", [])] if c and c != "native"}


def _model_block(model: str, form: str) -> tuple[dict, dict[str, Path]]:
    if model == NO_MODEL or form == "none":
        return {"name": model, "form": "none", "source": {"none": "command engine"}, "format": "none",
                "dtype": "none", "parameters": 1, "files": []}, {}
    root = models.ensure(model)
    block = models.loaded_block(model, form)  # hashed now; a file that is not the manifest's is refused
    weights = {rel: root / rel for rel in models.weight_files(model, form)}
    return block, weights


def default_cpus(threads: int) -> list[int]:
    """An arm without cpus runs on the first `threads` CPUs this process may use (not 0..threads-1: under an
    affinity that excludes CPU 0, taskset would refuse those)."""
    return sorted(os.sched_getaffinity(0))[:threads]


def _threads(spec: grid.GridSpec, arm: grid.Arm, params: dict) -> int:
    return int(arm.options.get("threads") or params.get("threads"))


def run_one(spec: grid.GridSpec, run: RunSpec, workroot: Path, store_root: Path | None = None) -> dict:
    """One run: residency before, the engine in a fresh process, residency after, the artifact document."""
    arm = spec.arm(run.arm)
    engine = get_engine(arm.engine)
    threads = _threads(spec, arm, run.cell.params)
    hw = grid.hardware_of(arm, run.cell.params)
    em = emulate.plan(hw, threads, arm.cpus, f"{spec.path}: arms[{arm.name}]") if hw else None
    profile = hardware.profile_from_class(em.cls, f"class {em.cls.name} (emulated)") if em else None
    asked = run.cell.params.get("form") or arm.form
    model = grid.model_of(spec, run.cell.params)
    form = engine.check(model, asked, profile or hardware.current_profile())
    form_override = {"form": {"requested": "auto", "effective": form, "rule": engine.form_for(
        profile or hardware.current_profile())[1]}} if asked == "auto" else {}
    model_block, weights = _model_block(model, form)
    cpus = em.cpus if em else (arm.cpus or default_cpus(threads))
    observe = arm.observe != "bare"
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.run_key}-", dir=workroot))
    ctx = RunContext(spec=spec, run=run, arm=arm, threads=threads, cpus=cpus, workdir=workdir, timeout_s=spec.timeout_s,
                     store_root=store_root, observe=observe)
    if em:
        ctx.env, ctx.isa_variant = dict(em.env), em.llamacpp_variant
        ctx.profile = profile
        ctx.isa = profile["isa"] if profile else None
        if em.llamacpp_variant:
            engine.provision(em.llamacpp_variant)  # the capped build, made before anything is measured
        emulate.inflate(em)  # the balloon holds from before the residency scan to after the last one
    held = True
    try:
        before = files_residency(weights) if observe else {}
        span = provenance.Span()
        try:
            res: EngineResult = engine.run(ctx, form)
        except UserError:
            raise
        except Exception as e:  # a harness-side crash in one run is stored, the grid goes on
            from harness.engines.base import failed
            res = failed("failed", f"{type(e).__name__}: {e}", [], {})
        host, timing = span.finish()
        after = files_residency(weights) if observe else {}
    finally:
        if em:
            held = emulate.deflate(em)
    emulation = None
    if em:
        host["machine_key"] = host["key"]  # the machine the class was emulated on (the report's series)
        host["emulation"] = em.cls.name  # part of the host key: an emulated class is a host of its own
        host["key"] = key_of(host)
        emulation = emulate.record(em, engine.name, res.effective, res.settings, held)
    page_cache = "not observed (arm observe: bare)" if not observe else "none" if not before else (
        "warm" if all(v["resident_bytes"] >= 0.99 * v["total_bytes"] for v in before.values()) else
        "cold" if all(v["resident_bytes"] == 0 for v in before.values()) else "partial")
    residency = {"before": before, "after_load": res.after_load, "after_run": after,
                 "peak_memory": res.peak_memory, "page_cache": page_cache}
    doc = document(spec, run, res, host, timing, model_block=model_block, threads=threads, cpus=cpus,
                   form_override=form_override, emulation=emulation, residency=residency)
    shutil.rmtree(workdir, ignore_errors=True)  # everything the artifact needs is in doc
    return doc


def document(spec: grid.GridSpec, run: RunSpec, res: EngineResult, host: dict, timing: dict, *, model_block: dict,
             threads: int, cpus: list[int], form_override: dict | None = None, emulation: dict | None = None,
             residency: dict | None = None, executor: dict | None = None, env: dict | None = None) -> dict:
    """A run's artifact document (not yet finalized) from what the engine returned and the host it ran on."""
    arm = spec.arm(run.arm)
    engine = get_engine(arm.engine)
    p = run.cell.params
    engine_block = {"name": res.engine.get("name", arm.engine), "version": res.engine.get("version", "unknown"),
                    "build_commit": res.engine.get("build_commit", "unknown"), "build": res.engine.get("build", {}),
                    "patches": res.engine.get("patches", []),
                    "overrides": {**res.engine.get("overrides", {}), **(form_override or {})}}
    return {
        "schema_version": artifact.SCHEMA_VERSION, "kind": "run", "status": res.status, "error": res.error,
        "stderr_tail": res.stderr_tail,
        "grid": {"path": spec.path, "sha256": spec.sha256, "name": spec.name, "cell": run.cell.id,
                 "cell_params": p, "arm": arm.name, "pass_index": run.pass_index, "position": run.position,
                 "order": spec.order, "seed": spec.seed, "run_key": run.run_key, "baseline_arm": spec.baseline,
                 "primary": spec.primary},
        "model": model_block,
        "engine": engine_block,
        "harness": provenance.harness_info(),
        "host": host,
        "execution": {"threads": threads, "cpu_affinity": cpus, "numa_policy": provenance.numa_policy()
                      if arm.numa is not None else "default (no numa option)",
                      "env": {**provenance.relevant_env(), **res.env} if env is None else env,
                      "requested": res.requested,
                      "effective": res.effective, "compile_cache": res.compile_cache, "eager": res.eager,
                      artifact.COMMAND: _command(res.command), "observe": arm.observe,
                      "settings": settings_block(res.settings, engine, arm), "emulation": emulation,
                      **({"executor": executor} if executor else {})},
        "workload": {"prompt_len": p["prompt_len"], "context_len": p["context_len"], "gen_len": p["gen_len"],
                     "batch": p.get("batch", 1), "warmups": spec.warmups, "repetitions": spec.repetitions,
                     "prompt_token_hash": res.prompt_token_hash},
        "residency": residency or {"before": {}, "after_load": res.after_load, "after_run": {},
                                   "peak_memory": res.peak_memory, "page_cache": "not observed (the run did not complete)"},
        "metrics": res.metrics,
        **({"attribution": res.attribution} if res.attribution else {}),
        "timing": timing,
    }


def _command(cmd: list) -> list:
    """The command that ran, or the list of commands where there were several."""
    if cmd and isinstance(cmd[0], list):
        return [[str(c) for c in one] for one in cmd]
    return [str(c) for c in cmd]


def settings_block(settings: dict, engine, arm: grid.Arm) -> dict:
    """Each declared setting as requested and as read back, with the rule `harness check` applies to it:
    enforced (effective must equal requested), or observe only (declared so by the engine or the arm)."""
    out = {}
    for name, row in settings.items():
        if name in engine.observe_only:
            rule = f"observe only ({engine.name} cannot apply or read it back)"
        elif name in arm.observe_only:
            rule = "observe only (arm)"
        else:
            rule = "enforced"
        out[name] = {**row, "rule": rule}
    return out


def run(grid_path: str, store_root: str | Path = "artifacts", new_series: bool = False,
        retry_failed: bool = True, out=None) -> RunSummary:
    out = sys.stderr if out is None else out  # read at call time: a stream bound at import may be closed since
    spec = grid.load(grid_path)
    for a in spec.arms:  # fail fast on a bad arm before any engine starts
        get_engine(a.engine).check(spec.model, a.form)
    store = Store(Path(store_root))
    lock = _lock(store, spec)  # held until this function returns (the file object closes)
    runs = schedule(spec)
    from harness.schedule import passes_warning
    warn = passes_warning(spec)
    if warn:
        print(f"[harness] {warn}", file=out)
    host = provenance.current_host_key()
    done, other_hosts = existing(store, spec, new_series, host)
    # a run is finished when this host has an ok artifact for it (or any, when failures are not retried)
    todo = [r for r in runs if not any(a.status == "ok" or not retry_failed for a in done.get(r.run_key, []))]
    skipped = len(runs) - len(todo)
    others = f"; {other_hosts} artifact(s) of other hosts kept apart" if other_hosts else ""
    print(f"[harness] grid {spec.name} on host {host}: {len(runs)} runs, {skipped} already stored by this host, "
          f"{len(todo)} to run -> {store.grid_dir(spec.name)}{others}", file=out)
    ok = bad = 0
    paths = []
    durations: list[float] = []
    workroot = lifecycle.new_root("run")
    for i, r in enumerate(todo):
        eta = ""
        if durations:
            rem = sum(durations) / len(durations) * (len(todo) - i)
            eta = f" ETA {int(rem // 60)}m{int(rem % 60):02d}s"
        print(f"[{i + 1}/{len(todo)}] pass {r.pass_index} pos {r.position} arm {r.arm:<12} cell {r.cell.id}{eta}",
              file=out, flush=True)
        with lifecycle.measuring(out):
            t0 = time.time()
            doc = run_one(spec, r, workroot, store.root)
        a = artifact.finalize(doc)
        path = store.write(a)
        paths.append(path)
        durations.append(time.time() - t0)
        if a.status == "ok":
            ok += 1
            shown = [k for k in ("decode_tok_s", "ttft_s") if k in a.metrics] or list(a.metrics)[:1]
            brief = ", ".join(f"{k} median {statistics.median(a.metrics[k].samples):.4g} {a.metrics[k].unit}"
                              for k in shown)
            print(f"    ok in {durations[-1]:.1f} s {brief}", file=out, flush=True)
            for problem in read_back_problems(a, "    read-back"):
                print(problem, file=out, flush=True)
        else:
            bad += 1
            print(f"    {a.status}: {a.error}", file=out, flush=True)
    print(f"[harness] done: {ok} ok, {bad} failed, {skipped} skipped; store {store.grid_dir(spec.name)}", file=out)
    lock.close()
    return RunSummary(done=ok, failed=bad, skipped=skipped, store=store.grid_dir(spec.name), paths=paths)


def _lock(store: Store, spec: grid.GridSpec):
    """One `harness run` per grid and store at a time: two would measure under each other's load
    and run the same pass twice. The lock file is opened without following a link and never truncated
    (a `.lock` planted in a store as a link to another file must not empty that file)."""
    import fcntl
    d = store.grid_dir(spec.name)
    path = d / ".lock"
    try:
        store._mkdir(d)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        why = "is a symlink" if e.errno == errno.ELOOP else f"cannot be opened: {e.strerror}"
        raise UserError(str(path), why, "remove it (a lock is a plain file the runner creates) or make the store "
                        "writable") from None
    f = os.fdopen(fd, "r+b")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise UserError(str(path), "is not a regular file", "remove it; the runner creates its own lock")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UserError(str(d), "another `harness run` of this grid is running on this store",
                        "wait for it to finish (or stop it), then run again to resume") from None
    return f
