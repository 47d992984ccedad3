"""The execution loop: one for every executor (this machine, a Ray fleet, the tests' fake).

The loop plans the grid, holds the store's lock for the grid, finds what each machine already stored (by run
key and host key: another machine's runs never count as done here), hands passes to machines (Dispatch), runs
each run through the executor, prints progress and ETA, writes every artifact atomically (a failed run and a
run lost with its machine too), and sums up. An executor answers five calls: `machines`, `prepare`, `run`,
`recover`, `close` (and `clock`, the seconds the ETA and a lost run's timing read); `Local` is this machine,
harness.fleet.Ray a cluster, tests/fake_executor.Fake a deterministic stand-in for the loop's own tests. Every
executor measures through `measure` on the machine that measures (its measurement lock around runner.run_one).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import stat
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Protocol

from harness import grid, lifecycle, provenance, runner
from harness.errors import UserError
from harness.schedule import RunSpec, passes_warning, probe_keys, schedule
from harness.store import Store, gc_paused, load_path


class Lost(Exception):
    """The machine (or the node it ran on) was lost while a run was in flight: the run is stored as failed."""


class Refused(Exception):
    """The machine takes no (more) runs; the message is one line."""


@dataclass
class Machine:
    key: str  # the host key its runs are stored under
    cls: str  # its hardware class: `hosts: spread` divides passes among the machines of a class
    label: str
    keys: set[str] = field(default_factory=set)  # every key its artifacts may carry (emulated classes too)
    info: dict[str, Any] = field(default_factory=dict)  # what the executor knows of it (host block, prepared blocks)
    lost: bool = False
    refused: str | None = None
    done: dict[str, list] = field(default_factory=dict)  # run key -> this machine's stored artifacts
    durations: list[float] = field(default_factory=list)

    def finished(self) -> set[str]:
        """The run keys this machine holds an ok artifact of."""
        return {k for k, arts in self.done.items() if any(a.status == "ok" for a in arts)}


@dataclass
class RunSummary:
    done: int
    failed: int
    skipped: int
    store: Path
    paths: list[Path]


class Executor(Protocol):
    name: str

    def clock(self) -> float: ...

    def machines(self, spec: grid.GridSpec) -> list[Machine]: ...

    def prepare(self, m: Machine, spec: grid.GridSpec) -> None:
        """Make the machine ready for the grid (raise Refused with one line if it cannot be)."""

    def run(self, m: Machine, spec: grid.GridSpec, run: RunSpec, store_root: Path) -> Any:
        """One run on the machine: its finalized artifact; Lost or Refused."""

    def recover(self, m: Machine) -> bool:
        """After Lost: whether the machine goes on (from another of its nodes)."""

    def interrupt(self) -> None:
        """Ctrl-C on the driver: stop every run in flight."""

    def close(self) -> None: ...


# -- what a machine does for one run ----------------------------------------------------------------------------


def measure(spec: grid.GridSpec, run: RunSpec, workroot: Path, store_root: Path | None, out=None,
            executor: dict | None = None) -> Any:
    """One run under this machine's measurement lock (every executor's runs go through here, on the machine
    that measures): its artifact."""
    with lifecycle.measuring(out):
        return runner.run_one(spec, run, workroot, store_root, executor=executor)


def prepare_arms(spec: grid.GridSpec) -> None:
    """What each arm needs made before anything is measured (a user's engine build), on this machine."""
    from harness import models
    from harness.engines import get_engine
    for a in spec.arms:
        get_engine(a.engine).prepare_arm(spec, a)
    from harness import voices
    for name, forms in grid.model_forms(spec).items():  # a user's model: the forms the arms load, made now
        if voices.known(name):  # a voice's forms (the int8 one made here)
            for form in forms:
                voices.ensure(name, form)
        else:
            models.ensure(name, forms)


class Local:
    """This machine."""
    name = "local"

    def __init__(self, out=None) -> None:
        self.out = out
        self.workroot: Path | None = None

    def clock(self) -> float:
        return time.time()

    def machines(self, spec: grid.GridSpec) -> list[Machine]:
        key = provenance.current_host_key()
        # this machine emulating a class is a host of its own: its runs resume under that key
        keys = {key} | {provenance.host_key_as(c) for c in emulated_classes(spec)}
        return [Machine(key=key, cls="this machine", label=key, keys=keys)]

    def prepare(self, m: Machine, spec: grid.GridSpec) -> None:
        prepare_arms(spec)
        self.workroot = lifecycle.new_root("run")

    def run(self, m: Machine, spec: grid.GridSpec, run: RunSpec, store_root: Path) -> Any:
        assert self.workroot is not None, "prepare first"
        return measure(spec, run, self.workroot, store_root, self.out)

    def recover(self, m: Machine) -> bool:
        return False

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


# -- the store side ---------------------------------------------------------------------------------------------


def emulated_classes(spec: grid.GridSpec) -> set[str]:
    return {c for a in spec.arms for c in [a.hardware, *spec.axes.get("hardware", [])] if c and c != "native"}


def existing(store: Store, spec: grid.GridSpec, keys: set[str], new_series: bool = False,
             out=None) -> tuple[dict[str, list], int]:
    """Artifacts the machine with these host keys already stored for this grid file (same sha256), by run key,
    and how many of other hosts the store holds. A series is (grid sha256, host key). The machine's artifacts of
    another version of the grid file, and none of this one, mean the file changed: refused unless new_series."""
    from harness.check.accepted import accepted
    by_key: dict[str, list] = {}
    other_sha = set()
    other_hosts = 0
    with gc_paused():
        loaded = [(load_path(p, verify_id=True), str(p)) for p in store.iter_paths(spec.name)]
    # only what check accepts counts as done: a planted or edited "ok" artifact never stands in for a run
    arts, refused = accepted(loaded, tree_state=False)
    for line in [*store.left_out, *refused]:
        print(f"[harness] not counted as done (harness check refuses it): {line}", file=out or sys.stderr)
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


@contextlib.contextmanager
def grid_lock(store: Store, spec: grid.GridSpec) -> Iterator[None]:
    """One driver per grid and store at a time: two would measure under each other's load and run the same
    pass twice. The lock file is opened without following a link and never truncated (a `.lock` planted in a
    store as a link to another file must not empty that file)."""
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
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(str(path), "is not a regular file", "remove it; the runner creates its own lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(str(d), "another `harness run` of this grid is running on this store",
                            "wait for it to finish (or stop it), then run again to resume") from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


# -- which machine runs which pass --------------------------------------------------------------------------------


class Dispatch:
    """Which passes each machine runs: its own (passes it already holds runs of, or every pass with
    `hosts: all`), then, with `hosts: spread`, the next unclaimed pass of its class."""

    def __init__(self, spec: grid.GridSpec, by_pass: dict[int, list[RunSpec]], machines: dict[str, Machine]):
        self.lock = threading.Lock()
        self.by_pass = by_pass
        self.mode = spec.hosts
        self.own: dict[str, list[int]] = {k: [] for k in machines}
        self.shared: dict[str, list[int]] = {}
        self.waiting: dict[int, str] = {}  # pass -> the absent machine that holds its first runs
        for p, runs in sorted(by_pass.items()):
            keys = {r.run_key for r in runs}
            if self.mode == "all":
                for m in machines.values():
                    if not keys <= m.finished():
                        self.own[m.key].append(p)
                continue
            for cls in sorted({m.cls for m in machines.values()}):
                group = [m for m in machines.values() if m.cls == cls]
                holder = next((m for m in group if keys & m.finished()), None)
                if holder is not None:
                    if not keys <= holder.finished():
                        self.own[holder.key].append(p)
                else:
                    self.shared.setdefault(cls, []).append(p)

    def next_pass(self, m: Machine) -> int | None:
        with self.lock:
            if self.own[m.key]:
                return self.own[m.key].pop(0)
            q = self.shared.get(m.cls, [])
            return q.pop(0) if q else None

    def give_back(self, m: Machine, current: int | None = None) -> list[int]:
        """A lost machine's unstarted passes (the one it was on too, when none of its runs finished there): to
        its class's queue (spread), else they wait."""
        with self.lock:
            passes, self.own[m.key] = self.own[m.key], []
            if current is not None and not {r.run_key for r in self.by_pass[current]} & m.finished():
                passes.insert(0, current)
            if self.mode == "spread":
                self.shared.setdefault(m.cls, [])[:0] = passes
            else:
                for p in passes:
                    self.waiting[p] = m.label
            return passes

    def remaining(self, m: Machine, by_pass: dict[int, list[RunSpec]]) -> int:
        with self.lock:
            mine, done = self.own[m.key] + self.shared.get(m.cls, []), m.finished()
            return sum(1 for p in mine for r in by_pass[p] if r.run_key not in done)


# -- the loop -------------------------------------------------------------------------------------------------------


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lost_artifact(spec: grid.GridSpec, run: RunSpec, m: Machine, t0: float, t1: float, why: str,
                  executor: dict) -> Any:
    """The artifact of a run whose machine was lost while it ran: failed, on that machine's host, kept. What the
    machine would have run is what it prepared (its model blocks, engine blocks, environment); what it ran, it
    could not report."""
    from harness.engines import get_engine
    from harness.engines.base import failed
    arm = spec.arm(run.arm)
    model = grid.model_of(spec, run.cell.params)
    form = run.cell.params.get("form") or arm.form or get_engine(arm.engine).default_form
    model_block = runner.model_block(model, form)[0] if model == runner.NO_MODEL or form == "none" else \
        m.info.get("model_blocks", {}).get(f"{model}|{form}") or {
        "name": model, "form": form, "source": {"unknown": "the machine was lost before it reported the model"},
        "format": "unknown", "dtype": "unknown", "parameters": 1, "files": []}
    host = {**m.info["host"], "loadavg_before": m.info["host"].get("loadavg"),
            "loadavg_after": "unknown (machine lost)", "other_load_during_run": {"status": "unknown",
                                                                                "reason": "machine lost"}}
    host.pop("loadavg", None)
    threads = runner.threads_of(arm, run.cell.params)
    env = m.info.get("env") or {"(none)": "no relevant variable was set on that machine"}
    res = failed("failed", f"node lost: {why}", ["unknown (the node was lost before the run reported its command)"],
                 env, engine=m.info.get("engines", {}).get(arm.engine),
                 requested={"options": dict(arm.options), "threads": threads})
    timing = {"start": iso(t0), "end": iso(t1), "duration_s": round(t1 - t0, 6)}
    return runner.document(spec, run, res, host, timing, model_block=model_block, threads=threads,
                           cpus=list(arm.cpus or runner.default_cpus(threads)), env=env, executor=executor)


def run_grid(grid_path: str, store_root: str | Path = "artifacts", new_series: bool = False, out=None) -> RunSummary:
    """The grid on this machine."""
    return execute(grid_path, Local(out), store_root, new_series, out)


def execute(grid_path: str, executor: Executor, store_root: str | Path = "artifacts", new_series: bool = False,
            out=None) -> RunSummary:
    out = sys.stderr if out is None else out  # read at call time: a stream bound at import may be closed since
    from harness.check.content import read_back_problems
    from harness.engines import get_engine
    spec = grid.load(grid_path)
    for a in spec.arms:  # fail fast on a bad arm before any engine starts
        get_engine(a.engine).check(spec.model, a.form)
    store = Store(Path(store_root))
    with grid_lock(store, spec):
        runs = schedule(spec)
        warn = passes_warning(spec)
        if warn:
            print(f"[harness] {warn}", file=out)
        by_pass: dict[int, list[RunSpec]] = {}
        for r in runs:
            by_pass.setdefault(r.pass_index, []).append(r)
        try:
            machines = {m.key: m for m in executor.machines(spec)}
            for m in machines.values():
                m.done, others = existing(store, spec, m.keys, new_series, out)
                stored = sum(1 for r in runs if r.run_key in m.finished())
                note = f"; {others} artifact(s) of other hosts kept apart" if others and len(machines) == 1 else ""
                print(f"[harness] grid {spec.name} on host {m.label}: {len(runs)} runs, {stored} already stored by "
                      f"this host, {len(runs) - stored} to run -> {store.grid_dir(spec.name)}{note}", file=out,
                      flush=True)
                try:
                    executor.prepare(m, spec)
                except Refused as e:
                    m.refused = str(e)
                    print(f"[harness] {m.label}: takes no runs: {e}", file=out, flush=True)
            live = {k: m for k, m in machines.items() if not m.refused}
            if not live:
                raise UserError(spec.path, "no machine could prepare the grid", "see the lines above")
            loop = _Loop(spec, executor, store, by_pass, Dispatch(spec, by_pass, live), out, read_back_problems,
                         prefix=len(live) > 1)
            if len(live) == 1:  # in this thread: Ctrl-C stops it where it is
                loop.work(next(iter(live.values())))
            else:
                loop.in_threads(list(live.values()))
            left = sorted(loop.waiting().items())
            print(f"[harness] done: {loop.ok} ok, {loop.bad} failed, {loop.skipped} skipped"
                  + (f"; passes waiting for their machine (rerun to fill): {left}" if left else "")
                  + f"; store {store.grid_dir(spec.name)}", file=out, flush=True)
            return RunSummary(done=loop.ok, failed=loop.bad, skipped=loop.skipped, store=store.grid_dir(spec.name),
                              paths=loop.written)
        finally:
            executor.close()


class _Loop:
    """The runs of one execute call: each machine's passes, one run at a time per machine."""

    def __init__(self, spec, executor, store, by_pass, dispatch, out, read_back, prefix: bool) -> None:
        self.spec, self.executor, self.store, self.by_pass, self.dispatch = spec, executor, store, by_pass, dispatch
        self.out, self.read_back, self.prefix = out, read_back, prefix
        self.ok = self.bad = self.skipped = 0
        self.written: list[Path] = []
        self.guard = threading.Lock()
        self.stopping = threading.Event()  # Ctrl-C: runs are stopped on purpose, none of them was "lost"
        self.machines: list[Machine] = []
        self.looked: dict[str, int] = {}  # machine -> the passes complete at its last look (sequential passes)

    def say(self, m: Machine, line: str) -> None:
        print(f"{m.label}: {line}" if self.prefix else line, file=self.out, flush=True)

    def work(self, m: Machine) -> None:
        self.machines.append(m)
        todo = self.dispatch.remaining(m, self.by_pass)
        with self.guard:
            self.skipped += sum(1 for runs in self.by_pass.values() for r in runs if r.run_key in m.finished())
        i = 0
        while not m.lost:
            if self.spec.looks and self.answered(m):
                return
            p = self.dispatch.next_pass(m)
            if p is None:
                return
            for r in self.by_pass[p]:
                if r.run_key in m.finished():
                    continue
                i += 1
                if not self.one(m, r, i, max(todo, i)):
                    return

    def answered(self, m: Machine) -> bool:
        """Sequential passes (harness/sequential.py): at a look (that many passes complete on this machine), whether
        every declared comparison has its verdict; the runner then stops."""
        done = m.finished()
        n = sum(1 for runs in self.by_pass.values() if all(r.run_key in done for r in runs))
        if n not in self.spec.looks or self.looked.get(m.key) == n:
            return False
        self.looked[m.key] = n
        arts = [a for arts in m.done.values() for a in arts]
        k = self.spec.looks.index(n) + 1
        nxt = "" if n == self.spec.looks[-1] else f"; next look at {self.spec.looks[k]}"
        if self.spec.until == "step":
            from harness.analysis.history import histories
            hs = histories([a for a in arts if a.status == "ok"], self.spec.history,
                           tuple((self.spec.primary or {}).get("metrics", ())), self.spec.step_alpha)
            found = [f"{s.before} -> {s.after} ({h.metric})" for h in hs for s in h.steps if s.found]
            self.say(m, f"[harness] look {k} of {len(self.spec.looks)} at {n} passes: "
                     + (f"the history steps at {', '.join(found)}: stopping" if found else f"no step found{nxt}"))
            return bool(found)
        from harness.analysis import answered
        yes, got, of = answered(arts)
        self.say(m, f"[harness] look {k} of {len(self.spec.looks)} at {n} passes: {got} of {of} declared comparisons "
                 f"have a verdict" + ("; every one has: stopping" if yes else nxt))
        return yes

    def in_threads(self, machines: list[Machine]) -> None:
        def work(m: Machine) -> None:
            try:
                self.work(m)
            except Exception as e:  # this machine's thread fails alone, and says why
                m.lost = True
                self.say(m, f"stopped by {type(e).__name__}: {e}")
        threads = [threading.Thread(target=work, args=(m,), name=f"run-{m.key}", daemon=True) for m in machines]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            print("[harness] interrupted: stopping every run in flight", file=self.out, flush=True)
            self.stopping.set()
            self.executor.interrupt()
            raise

    def one(self, m: Machine, r: RunSpec, i: int, n: int) -> bool:
        from harness import sweep
        if sweep.between(r.cell.params.get("rate")) is not None:  # its rate: from the pass's probes, stored by now
            r = replace(r, sweep=sweep.resolve(r, probe_keys(self.spec, r), m.done))
        eta = ""
        if m.durations:
            rem = sum(m.durations) / len(m.durations) * (n - i + 1)
            eta = f" ETA {int(rem // 60)}m{int(rem % 60):02d}s"
        at = f" at {r.sweep['rate_req_s']:.3g} req/s" if r.sweep and "rate_req_s" in r.sweep else ""
        self.say(m, f"[{i}/{n}] pass {r.pass_index} pos {r.position} arm {r.arm:<12} cell {r.cell.id}{at}{eta}")
        t0 = self.executor.clock()
        try:
            a = self.executor.run(m, self.spec, r, self.store.root)
        except Lost as e:
            if self.stopping.is_set():
                return False
            a = lost_artifact(self.spec, r, m, t0, self.executor.clock(), str(e), m.info.get("executor", {}))
            self.store_one(m, r, a)
            self.say(m, f"    node lost during pass {r.pass_index} arm {r.arm}: stored as failed")
            if self.executor.recover(m):
                self.say(m, "    goes on from another node")
                return True
            m.lost = True
            passes = self.dispatch.give_back(m, r.pass_index)
            where = "to the other machines of its class" if self.spec.hosts == "spread" else "waiting for a rerun"
            self.say(m, f"    machine lost; pass {r.pass_index} waits for it, passes {passes} {where}")
            return False
        except Refused as e:
            m.refused, m.lost = str(e), True
            self.dispatch.give_back(m, r.pass_index)
            self.say(m, f"    stops: {e}")
            return False
        m.durations.append(self.executor.clock() - t0)
        self.store_one(m, r, a)
        if a.status == "ok":
            shown = [k for k in ("decode_tok_s", "ttft_s") if k in a.metrics] or list(a.metrics)[:1]
            brief = ", ".join(f"{k} median {statistics.median(a.metrics[k].samples):.4g} {a.metrics[k].unit}"
                              for k in shown)
            self.say(m, f"    ok in {m.durations[-1]:.1f} s {brief}")
            for problem in self.read_back(a, "    read-back"):
                self.say(m, problem)
        else:
            self.say(m, f"    {a.status}: {a.error}")
        return True

    def store_one(self, m: Machine, r: RunSpec, a: Any) -> None:
        with self.guard:
            self.written.append(self.store.write(a))
            if a.status == "ok":
                self.ok += 1
            else:
                self.bad += 1
        m.done.setdefault(r.run_key, []).append(a)

    def waiting(self) -> dict[int, str]:
        """Passes a lost machine started and did not finish: they wait for it (a rerun fills them)."""
        waiting = dict(self.dispatch.waiting)
        for m in self.machines:
            if m.lost:
                for p, runs in self.by_pass.items():
                    keys = {r.run_key for r in runs}
                    if keys & m.finished() and not keys <= m.finished():
                        waiting[p] = m.label
        return waiting
