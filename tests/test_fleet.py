"""Fleet mode on a local Ray cluster (two nodes of this one machine), and the runner's process hygiene.

What docs/fleet.md promises, each tested here: one measurement per physical machine at a time (the three
nodes share a host key, so their runs never overlap), every pass on one machine in its planned order, a
node lost mid-grid stored as a failed run and filled by a rerun, a store that passes `harness check`, a
client without the cluster's token refused, the real engines through Ray giving the artifacts a local run
gives; and for local runs, no engine process and no run folder outliving a `kill -9` of the runner.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness import fleet, grid, lifecycle, provenance
from harness.check import check
from harness.errors import UserError
from harness.execute import Dispatch, Machine
from harness.schedule import schedule
from harness.store import Store

# Ray reads its authentication mode once, when it is first imported: the token is set before that, for the
# clusters of this module and the drivers of its tests (nothing else in the suite imports ray)
TOKEN = secrets.token_hex(16)
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
ray = pytest.importorskip("ray", reason="make installs ray (the fleet extra)")
ROOT = Path(__file__).resolve().parent.parent

SLEEP_GRID = """
name: fleet-{name}
arms:
  - {{name: a, engine: command, options: {{cmd: "sleep {s}"}}}}
  - {{name: b, engine: command, options: {{cmd: "sleep {s}"}}}}
workload: {{prompt_len: 1, context_len: 1, gen_len: 1}}
threads: 1
passes: {passes}
repetitions: 1
warmups: 0
"""


@pytest.fixture(scope="module")
def cluster():
    """Head and one worker node on this machine (two nodes, the fewest that show a pass kept on one node and a
    machine going on from another when an agent is lost), token authentication on (the token in this process's env)."""
    from ray.cluster_utils import Cluster
    small = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}
    c = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False})
    c.add_node(**small)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        c.shutdown()


def _problems(store: Path, **kw) -> tuple[int, list[str]]:
    """harness check's findings, a dirty development tree aside (CI's clean clone has none)."""
    n, problems = check([store], **kw)
    return n, [p for p in problems if ": harness.dirty:" not in p]


def _docs(store: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in Store(store).iter_paths(name)]


def _grid(tmp_path: Path, name: str, s: float, passes: int) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(SLEEP_GRID.format(name=name, s=s, passes=passes)))
    return p


def test_each_pass_on_one_machine_one_run_at_a_time(cluster, tmp_path):
    g = _grid(tmp_path, "serial", 0.3, 3)
    s = fleet.run_on_fleet(str(g), store_root=tmp_path / "store", address=cluster.address)
    assert (s.done, s.failed) == (6, 0)
    docs = _docs(tmp_path / "store", "fleet-serial")
    spec = grid.load(g)
    assert sorted(d["grid"]["run_key"] for d in docs) == sorted(r.run_key for r in schedule(spec))
    assert {d["host"]["key"] for d in docs} == {provenance.current_host_key()}  # two nodes, one machine
    assert {d["execution"]["executor"]["name"] for d in docs} == {"ray"}
    for p in range(3):  # a pass on one node, in its planned order
        mine = sorted((d for d in docs if d["grid"]["pass_index"] == p), key=lambda d: d["timing"]["start"])
        assert len({d["execution"]["executor"]["node_id"] for d in mine}) == 1
        assert [d["grid"]["position"] for d in mine] == sorted(d["grid"]["position"] for d in mine)
    spans = sorted((d["timing"]["start"], d["timing"]["end"]) for d in docs)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two runs of one machine overlapped"
    n, problems = _problems(tmp_path / "store", verify_models=False)
    assert n == 6 and problems == []
    # a second run finds everything stored by this machine: nothing to do
    again = fleet.run_on_fleet(str(g), store_root=tmp_path / "store", address=cluster.address)
    assert (again.done, again.failed) == (0, 0)


LOST_GRID = """
name: fleet-lost
arms:
  - {name: a, engine: command, options: {cmd: "true"}}
  - name: b
    engine: command
    options:
      # the second run of the grid kills its own agent once (the marker is made atomically), then waits to die
      # with it: the run in flight when its machine's agent is lost, with no test waiting on a clock
      cmd: "if [ $HARNESS_PASS = 0 ] && mkdir MARKER 2>/dev/null; then pkill -9 -f '^ray::Agent'; exec sleep 31; fi"
workload: {prompt_len: 1, context_len: 1, gen_len: 1}
threads: 1
passes: 2
repetitions: 1
warmups: 0
"""


def test_agent_lost_mid_run_is_stored_failed_and_a_rerun_fills_only_it(cluster, tmp_path):
    g = tmp_path / "lost.yaml"
    g.write_text(LOST_GRID.replace("MARKER", str(tmp_path / "killed")))
    store = tmp_path / "store"
    s = fleet.run_on_fleet(str(g), store_root=store, address=cluster.address)
    assert (s.done, s.failed) == (3, 1)
    docs = _docs(store, "fleet-lost")
    lost = [d for d in docs if d["status"] != "ok"]
    assert len(lost) == 1 and lost[0]["error"].startswith("node lost") and lost[0]["grid"]["arm"] == "b"
    assert lost[0]["host"]["key"] == provenance.current_host_key()
    # the machine went on from another of its nodes
    assert len({d["execution"]["executor"]["node_id"] for d in docs}) == 2
    out = subprocess.run(["pgrep", "-f", "exec sleep 31|^sleep 31"], capture_output=True, text=True).stdout.split()
    assert out == [], "an engine process outlived its agent"
    n, problems = _problems(store, verify_models=False)
    assert n == 4 and problems == []
    again = fleet.run_on_fleet(str(g), store_root=store, address=cluster.address)
    assert (again.done, again.failed) == (1, 0)
    new = [d for d in _docs(store, "fleet-lost") if d["id"] not in {x["id"] for x in docs}]
    assert [d["grid"]["run_key"] for d in new] == [lost[0]["grid"]["run_key"]]


def test_a_client_without_the_token_is_refused(cluster):
    assert fleet.accepts_without_token(cluster.address) is False


OPEN_CLUSTER = """
import os, sys
from ray.cluster_utils import Cluster
from harness import fleet
from harness.errors import UserError
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 2**20,
                                                  "include_dashboard": False})
try:
    print("accepts", fleet.accepts_without_token(c.address))
    try:
        fleet.run_on_fleet(sys.argv[1], store_root=sys.argv[2], address=c.address)
    except UserError as e:
        print("refused", e)
finally:
    c.shutdown()
"""


def test_the_driver_refuses_a_cluster_without_authentication(tmp_path):
    """A cluster started without token authentication (in a process of its own: Ray's mode is per process)."""
    g = _grid(tmp_path, "open", 0.1, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-c", OPEN_CLUSTER, str(g), str(tmp_path / "store")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert "accepts True" in r.stdout, r.stderr[-2000:]
    assert "refused --address" in r.stdout and "accepts clients without a token" in r.stdout
    assert not list(tmp_path.rglob("store/**/*.json"))  # nothing ran, nothing stored


def _machine(key: str, cls: str, done: set[str] = frozenset()) -> Machine:
    from types import SimpleNamespace
    m = Machine(key=key, cls=cls, label=key)
    m.done = {k: [SimpleNamespace(status="ok")] for k in done}
    return m


def test_dispatch_spread_and_all(tmp_path):
    g = _grid(tmp_path, "plan", 0.1, 4)
    spec = grid.load(g)
    by_pass: dict = {}
    for r in schedule(spec):
        by_pass.setdefault(r.pass_index, []).append(r)
    started = {by_pass[2][0].run_key}  # machine a1 holds the first run of pass 2
    ms = {"a1": _machine("a1", "A", started), "a2": _machine("a2", "A"), "b1": _machine("b1", "B")}
    d = Dispatch(spec, by_pass, ms)
    assert d.next_pass(ms["a1"]) == 2  # its own started pass first
    assert d.next_pass(ms["a2"]) == 0 and d.next_pass(ms["a1"]) == 1  # then the class's queue, shared
    assert d.give_back(ms["a2"]) == []
    assert d.next_pass(ms["a1"]) == 3 and d.next_pass(ms["a1"]) is None
    assert [d.next_pass(ms["b1"]) for _ in range(5)] == [0, 1, 2, 3, None]  # each class runs every pass
    everywhere = Dispatch(grid.from_dict({**_yaml(g), "hosts": "all"}, str(g), "x"), by_pass, ms)
    assert [everywhere.next_pass(ms["a2"]) for _ in range(5)] == [0, 1, 2, 3, None]
    assert everywhere.give_back(ms["a1"]) == [0, 1, 2, 3] and set(everywhere.waiting) == {0, 1, 2, 3}


def _yaml(p: Path) -> dict:
    import yaml
    return yaml.safe_load(p.read_text())


def test_hosts_field_is_validated(write_grid):
    g = write_grid(SLEEP_GRID.format(name="x", s=0.1, passes=1) + "hosts: everywhere\n")
    with pytest.raises(UserError, match="hosts: unknown value 'everywhere'"):
        grid.load(g)


# The quickstart's two engines on tiny-llama, one run each: through Ray, the real engines' workers start inside a
# Ray worker (vLLM's engine process, llama.cpp's tool) and their artifacts are those a local run stores. The
# quickstart itself on SmolLM2-135M took two minutes here for the same check; published through Ray it is
# grids/quickstart-fleet.yaml.
RAY_ENGINES_GRID = """
name: ray-engines
model: tiny-llama
arms:
  - {name: llama.cpp, engine: llama.cpp, form: gguf-f32}
  - {name: vllm, engine: vllm, form: hf-fp32, options: {dtype: float32, eager: true, kv_cache_memory_bytes: 2000000}}
baseline: llama.cpp
workload: {prompt_len: 16, context_len: 256, gen_len: 4}
threads: 2
passes: 1
repetitions: 1
warmups: 0
timeout_s: 600
"""


@pytest.mark.engines
def test_real_engines_through_ray_give_the_artifacts_of_a_local_run(cluster, tmp_path):
    g = tmp_path / "ray-engines.yaml"
    g.write_text(RAY_ENGINES_GRID)
    s = fleet.run_on_fleet(str(g), store_root=tmp_path / "store", address=cluster.address)
    docs = _docs(tmp_path / "store", "ray-engines")
    assert s.failed == 0, [d.get("error") for d in docs]
    spec = grid.load(g)
    assert sorted(d["grid"]["run_key"] for d in docs) == sorted(r.run_key for r in schedule(spec))
    assert {d["host"]["key"] for d in docs} == {provenance.current_host_key()}
    assert {d["engine"]["name"] for d in docs} == {"llama.cpp", "vllm"} and all(d["metrics"] for d in docs)
    assert {d["execution"]["executor"]["name"] for d in docs} == {"ray"}, [d["execution"]["executor"] for d in docs]
    n, problems = _problems(tmp_path / "store")
    assert n == len(docs) and problems == []


def test_kill_9_of_the_runner_leaves_no_engine_and_its_run_folder_is_swept(tmp_path):
    """Every engine runs through lifecycle.run_process (vLLM's and OpenVINO's workers, llama.cpp's tools, the
    command engine's shell): the command engine's process stands for them. It says its pid through a FIFO when it
    starts, and its exit is waited for on a pidfd: no test clock."""
    import select
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    g = tmp_path / "kill.yaml"
    g.write_text(textwrap.dedent(f"""
        name: kill
        arms: [{{name: engine, engine: command, options: {{cmd: "echo $$ > {fifo}; exec sleep 61"}}}}]
        workload: {{prompt_len: 1, context_len: 1, gen_len: 1}}
        threads: 1
        passes: 1
        repetitions: 1
        warmups: 0
        timeout_s: 300
        """))
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer always open: select waits for data, not EOF
    proc = subprocess.Popen([str(Path(sys.executable).parent / "harness"), "run", str(g), "--store", str(tmp_path / "s")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runner_fd = os.pidfd_open(proc.pid)
    ready, _, _ = select.select([reader, runner_fd], [], [], 120)
    assert ready == [reader], "the engine never started (or the runner exited first)"
    engine = int(os.read(reader, 64).decode().split()[0])
    runs = list(Path(tempfile.gettempdir()).glob(f"{lifecycle.PREFIX}{proc.pid}-run-*"))
    assert runs, "the runner's run folder is named by its pid"
    engine_fd = os.pidfd_open(engine)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, _, _ = select.select([engine_fd], [], [], 10)
    assert gone == [engine_fd] or _zombie(engine), "the engine outlived its runner"
    lifecycle.sweep_stale()  # (a runner of another test worker may have swept them first: the same code)
    assert not any(p.exists() for p in runs)
    for fd in (reader, runner_fd, engine_fd):
        os.close(fd)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_sign_test_is_exact():
    from harness.stats import sign_test_p
    assert sign_test_p(2, 0) == 0.5 and sign_test_p(5, 0) == 0.0625 and sign_test_p(0, 0) == 1.0
    assert abs(sign_test_p(8, 2) - 0.109375) < 1e-12  # 2 * (1 + 10 + 45) / 1024


def test_across_hosts_sets_each_hosts_ratio_side_by_side():
    from harness.report import across_hosts

    def sec(host, ratio, sha="s1"):
        return {"name": "g", "grid_sha": sha, "host_key": host, "tables": [{"metric": "decode_tok_s", "rows": [
            {"cell": "batch=1,threads=2", "arm": "base", "ratio_value": None},
            {"cell": "batch=1,threads=2", "arm": "b", "ratio_value": ratio}]}]}
    out = across_hosts([sec("h1", 0.5), sec("h2", 0.6), sec("h3", 0.4), sec("h4", 2.0, sha="other")])
    assert len(out) == 1 and out[0]["hosts"] == ["h1", "h2", "h3"]  # another grid file is another experiment
    (row,) = out[0]["rows"]
    assert row["ratios"] == ["0.500", "0.600", "0.400"] and row["median"] == "0.500" and row["spread"] == "1.500"
    assert row["sign"] == "0 above 1, 3 below; p = 0.25"
    assert across_hosts([sec("h1", 0.5)]) == []  # one host: nothing across hosts


def test_one_measurement_per_machine_lock_waits_and_says_so(tmp_path, monkeypatch):
    """The lock's logic on a lock file of the test's own: on the machine's, the suite's other workers measure too,
    and one of their runs could take the lock between its release here and the waiting second runner."""
    import io
    monkeypatch.setattr(lifecycle, "machine_lock", lambda: tmp_path / "measuring.lock")
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with lifecycle.measuring():
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    out = io.StringIO()

    def second():
        with lifecycle.measuring(out, "the next run"):
            done.set()

    t2 = threading.Thread(target=second)
    t2.start()
    deadline = time.time() + 10
    while "waiting" not in out.getvalue() and time.time() < deadline:
        time.sleep(0.01)
    assert "another runner is measuring on this machine" in out.getvalue() and not done.is_set()
    release.set()
    t.join(10)
    t2.join(10)
    assert done.is_set()


def test_stale_run_folders_of_dead_runners_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{lifecycle.PREFIX}{dead.pid}-run-abc"
    live = tmp_path / f"{lifecycle.PREFIX}{os.getppid()}-run-def"
    other = tmp_path / "edge-harness-cache"
    for d in (stale, live, other):
        d.mkdir()
    assert lifecycle.sweep_stale(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_wildcard_listeners_are_found_in_proc(tmp_path):
    """The check `harness fleet start` makes after `ray start` (Ray 2.60.0 binds GCS and raylet to every
    interface whatever --node-ip-address says): LISTEN sockets of the given processes on 0.0.0.0 or ::."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net" / "tcp").write_text(head +
        "   0: 00000000:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
        "   1: 0202000C:9569 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
        "   2: 00000000:1F90 00000000:0000 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n"
        "   3: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1\n")
    (proc / "net" / "tcp6").write_text(head +
        "   0: 00000000000000000000000000000000:18F0 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000     0        0 555 1\n")
    for pid, name, inodes in ((10, "gcs_server", (111, 333)), (11, "raylet", (222, 555))):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(name + "\n")
        for i, ino in enumerate(inodes):
            os.symlink(f"socket:[{ino}]", proc / str(pid) / "fd" / str(i))
    # 444 (sshd's, not ours) and 333 (not listening) and 222 (bound to one address) are not reported
    assert fleet.wildcard_listeners([10, 11], proc) == ["gcs_server:6379", "raylet:6384"]


def test_a_machine_whose_grid_file_differs_takes_no_runs(tmp_path, monkeypatch):
    """An agent prepares from its own checkout: another grid file (sha256) there, and it refuses in one line."""
    monkeypatch.chdir(tmp_path)  # the agent moves to the project root; monkeypatch moves back
    g = _grid(tmp_path, "differs", 0.1, 1)
    agent = fleet.Agent()
    prep = agent.prepare(str(g), "0" * 64)
    assert prep["ok"] is False and "differs on this machine" in prep["error"] and "\n" not in prep["error"]
    ok = agent.prepare(str(g), grid.load(g).sha256)
    assert ok["ok"] is True and ok["engines"]["command"]["name"] == "command"
