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
import time
from pathlib import Path
from typing import Any

from harness import grid, lifecycle, provenance
from harness.errors import UserError
from harness.execute import Lost, Machine, Refused, prepare_arms
from harness.schedule import RunSpec, schedule

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
            prepare_arms(spec)  # each arm's own build, if it names one
            forms = grid.model_forms(spec)
            for name in sorted(names):
                models.ensure(name, forms.get(name))
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

    def run(self, run_key: str, executor: dict[str, Any], sweep: dict[str, Any] | None = None) -> dict[str, Any]:
        """One run, under this machine's measurement lock: {"doc": the artifact's JSON} or {"error": one line}.
        `sweep`: a rate sweep point's load, as the driver resolved it from the pass's probes (harness/sweep.py)."""
        from dataclasses import replace

        from harness.execute import measure
        assert self.spec is not None, "prepare first"
        try:
            run = self.runs[run_key] if sweep is None else replace(self.runs[run_key], sweep=sweep)
            a = measure(self.spec, run, self.workroot, Path("artifacts"), executor=executor)
        except UserError as e:
            return {"error": str(e)}
        return {"doc": a.model_dump(mode="json")}


# -- the driver ------------------------------------------------------------------------------------------------


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


def discover(classes: list[str]) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """The machines behind the cluster's live nodes, by host key: (what the machine says of itself, its nodes)
    (a probe task placed on every node)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    probe = ray.remote(num_cpus=0, max_retries=0)(identify)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = {n: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(classes)
            for n in nodes}
    machines: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for n, ref in refs.items():
        try:
            info = ray.get(ref, timeout=120)
        except Exception:  # a node that cannot answer takes no runs
            continue
        machines.setdefault(info["key"], (info, []))[1].append(n)
    return machines


class Ray:
    """The machines of a Ray cluster, one agent per machine (an actor that runs one run at a time)."""
    name = "ray"

    def __init__(self, address: str | None, insecure: bool = False, out=None) -> None:
        self.address, self.insecure, self.out = address or os.environ.get("RAY_ADDRESS") or "auto", insecure, out
        self.ray = _ray()
        self.nodes: dict[str, list[str]] = {}  # machine key -> its live Ray nodes
        self.agents: dict[str, tuple[Any, str]] = {}  # machine key -> (its agent, the node it runs on)
        self.spec: grid.GridSpec | None = None

    def clock(self) -> float:
        return time.time()

    def machines(self, spec: grid.GridSpec) -> list[Machine]:
        from harness.execute import emulated_classes
        connect(self.address, self.insecure)
        found = discover(sorted(emulated_classes(spec)))
        if not found:
            raise UserError(f"--address {self.address}", "no live node answered", "start nodes (docs/fleet.md)")
        out = []
        for key, (info, nodes) in found.items():
            self.nodes[key] = nodes
            out.append(Machine(key=key, cls=info["class"], label=f"{info.get('hostname', '?')}/{key}",
                               keys={key, *info["emulated_keys"].values()}, info=info))
        print("[fleet] " + ", ".join(f"{m.label} ({m.cls}, {len(self.nodes[m.key])} node(s))" for m in out),
              file=self.out or sys.stderr, flush=True)
        return out

    def prepare(self, m: Machine, spec: grid.GridSpec, exclude: frozenset[str] = frozenset()) -> None:
        self.spec = spec
        if not self._start_agent(m, exclude):
            raise Refused("no live node")
        prep = self.ray.get(self.agents[m.key][0].prepare.remote(spec.path, spec.sha256))
        if not prep["ok"]:
            raise Refused(prep["error"])
        m.info.update(model_blocks=prep["model_blocks"], engines=prep["engines"], env=prep["env"])

    def _start_agent(self, m: Machine, exclude: frozenset[str]) -> bool:
        """An agent on one of the machine's live nodes (not those in exclude); False if none is left."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        alive = {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive")}
        self.nodes[m.key] = nodes = [n for n in self.nodes[m.key] if n in alive and n not in exclude]
        if not nodes:
            return False
        # not the head where the machine has another node: the head also runs the cluster's control plane
        node = min(nodes, key=lambda n: "node:__internal_head__" in alive[n].get("Resources", {}))
        cls = self.ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=1)(Agent)
        agent = cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        self.agents[m.key] = (agent, node)
        m.info["executor"] = {"name": "ray", "node_id": node, "node_ip": alive[node].get("NodeManagerAddress"),
                              "ray_version": self.ray.__version__}
        return True

    def run(self, m: Machine, spec: grid.GridSpec, run: RunSpec, store_root: Path) -> Any:
        from harness import artifact
        agent, node = self.agents[m.key]
        try:
            res = self.ray.get(agent.run.remote(run.run_key, m.info["executor"], run.sweep))
        except self.ray.exceptions.RayActorError as e:
            raise Lost(str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__) from None
        if "error" in res:
            raise Refused(res["error"])
        a = artifact.parse(res["doc"], f"artifact of run {run.run_key} from {m.label}")
        if not artifact.id_matches(res["doc"], finite=False):
            raise Refused(f"its artifact of run {run.run_key} does not hash to its id")
        return a

    def recover(self, m: Machine) -> bool:
        _, node = self.agents.pop(m.key)
        try:
            self.prepare(m, self.spec, exclude=frozenset({node}))
        except Refused:
            return False
        return True

    def interrupt(self) -> None:
        print("[fleet] interrupted: stopping every agent (their engines die with them)", file=self.out or sys.stderr,
              flush=True)
        self.close(shutdown=False)

    def close(self, shutdown: bool = True) -> None:
        for agent, _ in self.agents.values():
            try:
                self.ray.kill(agent, no_restart=True)
            except Exception:  # an agent whose node is gone
                pass
        self.agents.clear()
        if shutdown:
            self.ray.shutdown()


def run_on_fleet(grid_path: str, store_root: str | Path = "artifacts", address: str | None = None, insecure: bool = False,
        new_series: bool = False, out=None) -> Any:
    """The grid across the machines of a Ray cluster: the one execution loop (harness.execute) with Ray."""
    from harness.execute import execute
    return execute(grid_path, Ray(address, insecure, out), store_root, new_series, out)


def status(address: str | None, insecure: bool = False) -> list[str]:
    """The cluster's machines, one line each: host key, class, hostname, nodes, harness commit."""
    ray = _ray()
    connect(address or os.environ.get("RAY_ADDRESS") or "auto", insecure)
    try:
        machines = discover([])
        return [f"{key}  {info['class']:<24} {info.get('hostname', '?'):<20} {len(nodes)} node(s)  harness "
                f"{str(info['harness'].get('commit'))[:12]}{' (dirty)' if info['harness'].get('dirty') else ''}"
                for key, (info, nodes) in machines.items()] or ["no live node answered"]
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
