"""Fleet mode: one grid across the machines of a Ray cluster (docs/fleet.md).

The driver (`harness run GRID --executor ray --address HEAD:PORT`) plans the grid as a local run would,
finds the physical machines behind the cluster's nodes (each node reports its host key: two Ray nodes on
one box are one machine) and keeps one agent per machine, an actor that runs one run at a time. The
guarantees, each tested in tests/test_fleet.py:

- One measurement per physical machine at a time: one agent per host key, its runs sent one after the
  other, and on the machine itself the lock every runner takes (lifecycle.measuring), so a local
  `harness run` or another driver's agent on the same box waits too.
- A pass runs entirely on one machine, in its planned order. `hosts: spread` (the default) divides the
  passes among the machines of each host class, a machine taking the next pass when it is free;
  `hosts: all` runs every pass on every machine (a hardware comparison).
- Artifacts flow back to the driver's store, written atomically and content addressed; a rerun skips
  what each machine already stored (by run key and host key) and fills only the gaps.
- A node lost mid-run: the run in flight is stored as failed ("node lost"); the machine goes on from
  another of its Ray nodes if it has one, else its unstarted passes go to the other machines of its class
  (`hosts: spread`) or wait for a rerun (`hosts: all`); a pass it started is finished by it, on a rerun.
- Ctrl-C on the driver kills every agent; each engine process dies with its agent (PR_SET_PDEATHSIG).
- Nobody else gets in: the driver refuses a cluster that accepts a client without its token unless told
  --insecure (`harness fleet start` starts nodes with RAY_AUTH_MODE=token, bound to the address named).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import artifact, grid, lifecycle, provenance
from harness.errors import UserError
from harness.schedule import RunSpec, schedule
from harness.store import Store

NAMESPACE = "edge-harness"
PROBE_TIMEOUT_S = 45.0


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray", "Ray is not installed in this environment",
                        "make (installs the pinned ray), or pip install 'edge-harness[fleet]'") from None
    return ray


# -- on each node ---------------------------------------------------------------------------------------------


def identify(classes: list[str]) -> dict[str, Any]:
    """What a node says of its machine: host key (and the keys it has when emulating the grid's classes),
    host class, the harness tree, the Ray node."""
    from harness import hardware
    ray = _ray()
    host = provenance.host_info()
    return {"key": host["key"], "class": hardware.class_name_of(hardware.profile_from_probe(host)),
            "hostname": host.get("hostname", "unknown"), "host": host,
            "emulated_keys": {c: provenance.host_key_as(c) for c in classes},
            "harness": provenance.harness_info(), "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


class Agent:
    """One per physical machine: prepares the machine for a grid, then runs its runs one at a time."""

    def __init__(self) -> None:
        os.chdir(provenance.PROJECT_ROOT)  # grid paths are relative to the checkout, as for a local run
        self.workroot = lifecycle.new_root("fleet")
        self.spec: grid.GridSpec | None = None
        self.runs: dict[str, RunSpec] = {}

    def identify(self, classes: list[str]) -> dict[str, Any]:
        return identify(classes)

    def prepare(self, grid_path: str, sha256: str) -> dict[str, Any]:
        """Load the same grid file (same sha256) from this machine's checkout, and provision what it needs:
        the llama.cpp build (keyed by this machine's ISA) and the model zoo, verified against the manifest.
        {"ok": True} or {"ok": False, "error": one line}: a machine that cannot prepare takes no runs."""
        from harness import models
        from harness.engines import get_engine
        try:
            spec = grid.load(grid_path)
            if spec.sha256 != sha256:
                raise UserError(grid_path, f"differs on this machine (sha256 {spec.sha256[:12]}..., the driver's "
                                f"{sha256[:12]}...)", "check out the driver's commit on every node")
            names = {grid.model_of(spec, c.params) for c in grid.expand(spec)} - {"none"}
            for a in spec.arms:
                get_engine(a.engine).check(spec.model, a.form)
            for name in sorted({a.engine for a in spec.arms}):
                get_engine(name).provision()  # what each engine runs, built on this machine (cached)
            for name in sorted(names):
                models.ensure(name)
                bad = models.verify(name, full=True)
                if bad:
                    raise UserError(str(models.model_dir(name)), bad[0], f"harness models prepare {name} --rebuild")
        except UserError as e:
            return {"ok": False, "error": str(e)}
        self.spec = spec
        self.runs = {r.run_key: r for r in schedule(spec)}
        blocks = {}  # for the driver's record of a run lost with its node
        for c in grid.expand(spec):
            for a in grid.arms_for(spec, c):
                model, form = grid.model_of(spec, c.params), c.params.get("form") or a.form
                if model != "none" and form != "auto":
                    blocks[f"{model}|{form}"] = models.model_block(model, form)
        engines = {a.engine: get_engine(a.engine).engine_info() for a in spec.arms}
        return {"ok": True, "models": sorted(names), "model_blocks": blocks, "engines": engines,
                "env": provenance.relevant_env()}

    def run(self, run_key: str, executor: dict[str, Any]) -> dict[str, Any]:
        """One run, under this machine's measurement lock: {"doc": artifact document} or {"error": one line}."""
        from harness import runner
        assert self.spec is not None, "prepare first"
        ray = _ray()
        try:
            with lifecycle.measuring():
                doc = runner.run_one(self.spec, self.runs[run_key], self.workroot, Path("artifacts"))
        except UserError as e:
            return {"error": str(e)}
        doc["execution"]["executor"] = {**executor, "node_id": ray.get_runtime_context().get_node_id(),
                                        "node_ip": ray.util.get_node_ip_address(), "ray_version": ray.__version__}
        return {"doc": doc}


# -- the driver ------------------------------------------------------------------------------------------------


@dataclass
class Machine:
    key: str
    cls: str
    info: dict[str, Any]
    nodes: list[str]  # this machine's live Ray nodes
    agent: Any = None
    node: str | None = None  # the node its agent runs on
    lost: bool = False
    refused: str | None = None
    done: dict[str, list] = field(default_factory=dict)  # run key -> this machine's stored artifacts
    durations: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.info.get('hostname', '?')}/{self.key}"


def accepts_without_token(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the cluster at address lets in a client that has no token: a fresh process, with token
    authentication off and no token in its environment, tries to connect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_gcs_server_port_wait_time_s"] = "3"  # a refused client retries each second, 20 times by default
    code = ("import sys, ray\nray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR')\n"
            "ray.nodes()\nprint('CONNECTED', flush=True)\nray.shutdown()\n")
    proc = lifecycle.popen([sys.executable, "-c", code, address], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return "CONNECTED" in out


def connect(address: str, insecure: bool) -> None:
    ray = _ray()
    if not insecure and accepts_without_token(address):
        raise UserError(f"--address {address}", "the cluster accepts clients without a token: anyone who reaches "
                        "its port can run anything on every node", "start its nodes with RAY_AUTH_MODE=token "
                        "(harness fleet start, docs/fleet.md), or pass --insecure for a cluster you trust")
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    except Exception as e:  # ConnectionError, or the token refused
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--address {address}", f"cannot connect: {line}", "check the address and that this shell "
                        "has the cluster's token (RAY_AUTH_MODE=token, ~/.ray/auth_token; docs/fleet.md)") from None


def discover(classes: list[str]) -> dict[str, Machine]:
    """The machines behind the cluster's live nodes, by host key (a probe task placed on every node)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    probe = ray.remote(num_cpus=0, max_retries=0)(identify)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = {n: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(classes)
            for n in nodes}
    machines: dict[str, Machine] = {}
    for n, ref in refs.items():
        try:
            info = ray.get(ref, timeout=120)
        except Exception:  # a node that cannot answer takes no runs
            continue
        m = machines.setdefault(info["key"], Machine(key=info["key"], cls=info["class"], info=info, nodes=[]))
        m.nodes.append(n)
    return machines


def _start_agent(m: Machine, exclude: set[str] = frozenset()) -> bool:
    """An agent on one of the machine's live nodes (not those in exclude); False if none is left."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    m.nodes = [n for n in m.nodes if n in alive and n not in exclude]
    if not m.nodes:
        return False
    # not the head where the machine has another node: the head also runs the cluster's control plane
    m.node = min(m.nodes, key=lambda n: "node:__internal_head__" in alive[n].get("Resources", {}))
    cls = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=1)(Agent)
    m.agent = cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(m.node, soft=False)).remote()
    return True


class Dispatch:
    """Which passes each machine runs: its own (passes it already holds runs of, or every pass with
    `hosts: all`), then, with `hosts: spread`, the next unclaimed pass of its class."""

    def __init__(self, spec: grid.GridSpec, by_pass: dict[int, list[RunSpec]], machines: dict[str, Machine]):
        self.lock = threading.Lock()
        self.mode = spec.hosts
        self.own: dict[str, list[int]] = {k: [] for k in machines}
        self.shared: dict[str, list[int]] = {}
        self.waiting: dict[int, str] = {}  # pass -> the absent machine that holds its first runs
        for p, runs in sorted(by_pass.items()):
            keys = {r.run_key for r in runs}
            if self.mode == "all":
                for m in machines.values():
                    if not keys <= _ok_keys(m):
                        self.own[m.key].append(p)
                continue
            for cls in sorted({m.cls for m in machines.values()}):
                group = [m for m in machines.values() if m.cls == cls]
                holder = next((m for m in group if keys & _ok_keys(m)), None)
                if holder is not None:
                    if not keys <= _ok_keys(holder):
                        self.own[holder.key].append(p)
                else:
                    self.shared.setdefault(cls, []).append(p)

    def next_pass(self, m: Machine) -> int | None:
        with self.lock:
            if self.own[m.key]:
                return self.own[m.key].pop(0)
            q = self.shared.get(m.cls, [])
            return q.pop(0) if q else None

    def give_back(self, m: Machine) -> list[int]:
        """A lost machine's unstarted passes: to its class's queue (spread), else they wait."""
        with self.lock:
            passes, self.own[m.key] = self.own[m.key], []
            if self.mode == "spread":
                self.shared.setdefault(m.cls, [])[:0] = passes
            else:
                for p in passes:
                    self.waiting[p] = m.label
            return passes

    def remaining(self, m: Machine, by_pass: dict[int, list[RunSpec]]) -> int:
        with self.lock:
            mine, done = self.own[m.key] + self.shared.get(m.cls, []), _ok_keys(m)
            return sum(1 for p in mine for r in by_pass[p] if r.run_key not in done)


def _ok_keys(m: Machine) -> set[str]:
    return {k for k, arts in m.done.items() if any(a.status == "ok" for a in arts)}


def lost_document(spec: grid.GridSpec, run: RunSpec, m: Machine, start: str, t0: float, why: str) -> dict:
    """The artifact of a run whose node was lost while it ran: failed, on that machine's host, kept."""
    from harness import runner
    from harness.engines.base import failed
    arm = spec.arm(run.arm)
    model = grid.model_of(spec, run.cell.params)
    from harness.engines import get_engine
    form = run.cell.params.get("form") or arm.form or get_engine(arm.engine).default_form
    model_block = runner._model_block(model, form)[0] if model == runner.NO_MODEL or form == "none" else \
        m.info.get("model_blocks", {}).get(f"{model}|{form}") or {
        "name": model, "form": form, "source": {"unknown": "the node was lost before it reported the model"},
        "format": "unknown", "dtype": "unknown", "parameters": 1, "files": []}
    host = {**m.info["host"], "loadavg_before": m.info["host"].get("loadavg"), "loadavg_after": "unknown (node lost)",
            "other_load_during_run": {"status": "unknown", "reason": "node lost"}}
    host.pop("loadavg", None)
    timing = {"start": start, "end": provenance.now_utc(), "duration_s": round(time.time() - t0, 6)}
    threads = runner._threads(spec, arm, run.cell.params)
    # what the agent would have run, as prepared on that machine; what it ran, it could not report
    env = m.info.get("env") or {"(none)": "no relevant variable was set on that machine"}
    res = failed("failed", f"node lost: {why}", ["unknown (the node was lost before the run reported its command)"],
                 env, engine=m.info.get("engines", {}).get(arm.engine),
                 requested={"options": dict(arm.options), "threads": threads})
    return runner.document(spec, run, res, host, timing, model_block=model_block, threads=threads,
                           cpus=list(arm.cpus or runner.default_cpus(threads)), env=env,
                           executor={"name": "ray", "node_id": m.node, "node_ip": m.info.get("node_ip"),
                                     "ray_version": _ray().__version__})


def run(grid_path: str, store_root: str | Path = "artifacts", address: str | None = None, insecure: bool = False,
        new_series: bool = False, out=sys.stderr) -> Any:
    from harness import runner
    spec = grid.load(grid_path)  # every node reads its own copy (relative paths: from its checkout's root)
    store = Store(Path(store_root))
    lock = runner._lock(store, spec)
    runs = schedule(spec)
    by_pass: dict[int, list[RunSpec]] = {}
    for r in runs:
        by_pass.setdefault(r.pass_index, []).append(r)
    ray = _ray()
    connect(address or os.environ.get("RAY_ADDRESS") or "auto", insecure)
    classes = sorted(runner.emulated_classes(spec))
    try:
        machines = discover(classes)
        if not machines:
            raise UserError(f"--address {address}", "no live node answered", "start nodes (docs/fleet.md)")
        for m in machines.values():
            m.done, _ = runner.existing(store, spec, new_series, keys={m.key, *m.info["emulated_keys"].values()})
        print(f"[fleet] grid {spec.name}: {len(runs)} runs per host, hosts: {spec.hosts}; "
              f"{len(machines)} machine(s): " + ", ".join(f"{m.label} ({m.cls}, {len(m.nodes)} node(s))"
                                                         for m in machines.values()), file=out, flush=True)
        for m in machines.values():
            if not _start_agent(m):
                m.refused = "no live node"
                continue
            prep = ray.get(m.agent.prepare.remote(spec.path, spec.sha256))
            if not prep["ok"]:
                m.refused = prep["error"]
                print(f"[fleet] {m.label}: takes no runs: {prep['error']}", file=out, flush=True)
            else:
                m.info.update(model_blocks=prep["model_blocks"], engines=prep["engines"], env=prep["env"])
        live = {k: m for k, m in machines.items() if not m.refused}
        if not live:
            raise UserError(spec.path, "no machine of the cluster could prepare the grid", "see the lines above")
        dispatch = Dispatch(spec, by_pass, live)
        written: list[Path] = []
        counts = {"ok": 0, "failed": 0}
        guard = threading.Lock()
        stopping = threading.Event()  # Ctrl-C: the agents are killed on purpose, no run of theirs was "lost"

        def work(m: Machine) -> None:
            try:
                _work(m)
            except Exception as e:  # this machine's thread fails alone, and says why
                m.lost = True
                print(f"[fleet] {m.label}: stopped by {type(e).__name__}: {e}", file=out, flush=True)

        def _work(m: Machine) -> None:
            while not m.lost:
                p = dispatch.next_pass(m)
                if p is None:
                    return
                for r in by_pass[p]:
                    if r.run_key in _ok_keys(m):
                        continue
                    if not _one(m, r, p):
                        return

        def _one(m: Machine, r: RunSpec, p: int) -> bool:
            left = dispatch.remaining(m, by_pass) + len([x for x in by_pass[p] if x.run_key not in _ok_keys(m)])
            eta = ""
            if m.durations:
                rem = sum(m.durations) / len(m.durations) * left
                eta = f", ETA {int(rem // 60)}m{int(rem % 60):02d}s"
            print(f"[fleet] {m.label}: pass {p} pos {r.position} arm {r.arm} cell {r.cell.id} "
                  f"({left} left here{eta})", file=out, flush=True)
            start, t0 = provenance.now_utc(), time.time()
            try:
                res = ray.get(m.agent.run.remote(r.run_key, {"name": "ray"}))
            except ray.exceptions.RayActorError as e:
                if stopping.is_set():
                    return False
                why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                a = artifact.finalize(lost_document(spec, r, m, start, t0, why))
                with guard:
                    written.append(store.write(a))
                    counts["failed"] += 1
                print(f"[fleet] {m.label}: node lost during pass {p} arm {r.arm}: stored as failed", file=out, flush=True)
                if _start_agent(m, exclude={m.node} if m.node else set()):
                    prep = ray.get(m.agent.prepare.remote(spec.path, spec.sha256))
                    if prep["ok"]:
                        print(f"[fleet] {m.label}: goes on from node {m.node[:12]}", file=out, flush=True)
                        return True
                m.lost = True
                passes = dispatch.give_back(m)
                where = "to the other machines of its class" if spec.hosts == "spread" else "waiting for a rerun"
                print(f"[fleet] {m.label}: machine lost; pass {p} waits for it, passes {passes} {where}",
                      file=out, flush=True)
                return False
            if "error" in res:
                m.refused = res["error"]
                print(f"[fleet] {m.label}: stops: {res['error']}", file=out, flush=True)
                m.lost = True
                dispatch.give_back(m)
                return False
            a = artifact.finalize(res["doc"])
            with guard:
                written.append(store.write(a))
                counts["ok" if a.status == "ok" else "failed"] += 1
            m.done.setdefault(r.run_key, []).append(a)
            m.durations.append(time.time() - t0)
            print(f"[fleet] {m.label}: {a.status} in {m.durations[-1]:.1f} s", file=out, flush=True)
            return True

        threads = [threading.Thread(target=work, args=(m,), name=f"fleet-{m.key}", daemon=True) for m in live.values()]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            print("[fleet] interrupted: stopping every agent (their engines die with them)", file=out, flush=True)
            stopping.set()
            for m in live.values():
                if m.agent is not None:
                    ray.kill(m.agent, no_restart=True)
            raise
        waiting = {p: w for p, w in dispatch.waiting.items()}
        for m in live.values():
            if m.lost:
                for p in by_pass:
                    keys = {r.run_key for r in by_pass[p]}
                    if keys & _ok_keys(m) and not keys <= _ok_keys(m):
                        waiting[p] = m.label
        left = sorted(waiting.items())
        print(f"[fleet] done: {counts['ok']} ok, {counts['failed']} failed"
              + (f"; passes waiting for their machine (rerun to fill): {left}" if left else "")
              + f"; store {store.grid_dir(spec.name)}", file=out, flush=True)
        for m in live.values():
            if m.agent is not None and not m.lost:
                ray.kill(m.agent, no_restart=True)
        return runner.RunSummary(done=counts["ok"], failed=counts["failed"], skipped=0, store=store.grid_dir(spec.name),
                                 paths=written)
    finally:
        lock.close()
        ray.shutdown()


def status(address: str | None, insecure: bool = False) -> list[str]:
    """The cluster's machines, one line each: host key, class, hostname, nodes, harness commit."""
    ray = _ray()
    connect(address or os.environ.get("RAY_ADDRESS") or "auto", insecure)
    try:
        machines = discover([])
        return [f"{m.key}  {m.cls:<24} {m.info.get('hostname', '?'):<20} {len(m.nodes)} node(s)  harness "
                f"{str(m.info['harness'].get('commit'))[:12]}{' (dirty)' if m.info['harness'].get('dirty') else ''}"
                for m in machines.values()] or ["no live node answered"]
    finally:
        ray.shutdown()


# -- starting nodes ------------------------------------------------------------------------------------------


def start_node(bind: str, head: bool, join: str | None, port: int, object_store_mb: int,
               allow_all_interfaces: bool = False, out=sys.stderr) -> int:
    """`ray start` with token authentication on, bound to the address the user named."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if not ray_bin:
        raise UserError("ray", "is not installed in this environment", "make (installs the pinned ray)")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not env.get("RAY_AUTH_TOKEN") and not token_file.exists():
        if not head:
            raise UserError(str(token_file), "no cluster token on this machine",
                            f"copy {token_file} from the head node (mode 600), or set RAY_AUTH_TOKEN")
        subprocess.run([ray_bin, "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
        print(f"[fleet] generated the cluster token in {token_file}: copy it to every node (mode 600)", file=out)
    cmd = [ray_bin, "start", f"--node-ip-address={bind}", "--include-dashboard=false",
           f"--object-store-memory={object_store_mb * 1024 * 1024}"]
    cmd += ["--head", f"--port={port}"] if head else [f"--address={join}"]
    print("[fleet] " + " ".join(cmd), file=out, flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        return rc
    time.sleep(2)  # Ray's agents open their ports after `ray start` returns
    wild = wildcard_listeners(ray_pids())
    if wild:
        # Ray 2.60.0 binds its GCS and raylet servers to every interface whatever --node-ip-address says: the token
        # still guards them, but "bound to the address named" does not hold, so the node is not left running so
        # unless the user says so
        where = ", ".join(wild)
        if not allow_all_interfaces:
            subprocess.run([ray_bin, "stop"], env=env, capture_output=True)
            raise UserError("harness fleet start", f"Ray listens on all interfaces, not only {bind}: {where}; the node "
                            "was stopped", "restrict these ports to the fleet's network with a firewall, then rerun "
                            "with --allow-all-interfaces (token authentication stays on; docs/fleet.md)")
        print(f"[fleet] warning: Ray listens on all interfaces, not only {bind}: {where} (allowed by "
              "--allow-all-interfaces; token authentication guards them; firewall them to the fleet's network)",
              file=out, flush=True)
    return 0


def ray_pids() -> list[int]:
    """This user's Ray processes (GCS, raylet, Ray's Python agents and workers)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if p.stat().st_uid != os.getuid():
                continue
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if b"gcs_server" in cmd or b"raylet" in cmd or b"/site-packages/ray/" in cmd or cmd.startswith(b"ray::"):
            out.append(int(p.name))
    return out


def wildcard_listeners(pids: list[int], proc: Path = Path("/proc")) -> list[str]:
    """`name:port` of each TCP socket in LISTEN state that the processes hold on a wildcard address (0.0.0.0, ::)."""
    owner: dict[str, str] = {}
    for pid in pids:
        try:
            name = (proc / str(pid) / "comm").read_text().strip()
            for fd in (proc / str(pid) / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    owner[link[8:-1]] = name
        except OSError:
            continue
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A" or f[9] not in owner:
                continue
            addr, port = f[1].rsplit(":", 1)
            if set(addr) == {"0"}:
                found.append(f"{owner[f[9]]}:{int(port, 16)}")
    return sorted(set(found))
