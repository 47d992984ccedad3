"""Server engines against the real llama-server on tiny-llama: a closed loop at concurrency 2 and a Poisson rate,
their per-request records, percentiles, goodput and achieved rate; no server left after a run or after a
`kill -9` of the runner; a server that does not start is a failed artifact with its log; an endpoint the
harness does not start is recorded as external, and an unreachable one is refused in one line."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import execute
from harness.check import check_doc
from harness.store import Store

pytestmark = pytest.mark.engines
ROOT = Path(__file__).resolve().parents[1]

GRID = """
name: {name}
model: tiny-llama
arms:
  - {{name: llama-server, engine: llama-server, form: gguf-f32{env}}}
workload: {{prompt_len: 16, context_len: 256, gen_len: 8, load: {load}, slo: {{ttft_s: 5.0, tpot_s: 1.0}}}}
threads: 2
passes: 1
repetitions: {reps}
warmups: 1
timeout_s: 120
"""


MARK = "EDGE_TEST_SERVED"  # in the environment of the servers a test starts (its runs inherit it): only those count


def _server_pids(mark: str, exe_part: str = "llama-server") -> list[int]:
    """Live llama-server processes whose environment carries MARK=mark: the servers of the test that set it, leaked
    or not, never another test's (another module on another worker may run a llama-server at the same time)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv0 = (p / "cmdline").read_bytes().split(b"\0")[0]
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if os.path.basename(argv0) != exe_part.encode() or state in ("Z", "X"):
                continue
            environ = (p / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if f"{MARK}={mark}".encode() in environ:
            out.append(int(p.name))
    return out


def _run(tmp_path, name, load, reps=1, env=""):
    g = tmp_path / f"{name}.yaml"
    g.write_text(GRID.format(name=name, load=load, reps=reps, env=env))
    execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths(name)]
    assert len(docs) == 1
    return docs[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import uuid
    d = tmp_path_factory.mktemp("served")
    mark = os.environ[MARK] = uuid.uuid4().hex
    try:
        before = set(_server_pids(mark))
        closed = _run(d, "closed", "{concurrency: 2, requests: 6}", reps=2)
        left_closed = set(_server_pids(mark)) - before
        poisson = _run(d, "poisson", "{rate: 8, arrival: poisson, seed: 1, requests: 10}")
        vbench = _run(d, "vbench", "{concurrency: 2, requests: 6}", env=", options: {client: vllm-bench}")
        g = d / "sweep.yaml"
        g.write_text(GRID.format(name="sweep", load="{rate: sweep, points: 3, requests: 4}", reps=1, env=""))
        execute.run_grid(str(g), store_root=d / "store")
        sweep = {a["grid"]["cell_params"]["rate"]: a for a in
                 (json.loads(p.read_text()) for p in Store(d / "store").iter_paths("sweep"))}
        left = set(_server_pids(mark)) - before
    finally:
        os.environ.pop(MARK, None)
    return closed, poisson, left_closed, left, vbench, sweep, d / "store" / "sweep"


def test_a_closed_loop_at_concurrency_2_reads_back_and_passes_check(served):
    a = served[0]
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    s = a["execution"]["settings"]
    for name in ("threads", "cpus", "context_len", "options.parallel", "load.concurrency"):
        assert s[name]["rule"] == "enforced" and s[name]["effective"] == s[name]["requested"], (name, s[name])
    assert s["load.concurrency"]["effective"] == 2 and s["options.parallel"]["effective"] == 2
    assert a["workload"]["load"] == {"requests": 6, "concurrency": 2} and a["workload"]["slo"]["ttft_s"] == 5.0
    reps = a["serving"]["repetitions"]
    assert len(reps) == 2 and len(reps[0]["warmup_requests"]) == 1 and reps[1]["warmup_requests"] == []
    for rep in reps:
        assert len(rep["requests"]) == 6 and rep["most_in_flight"] == 2
        for r in rep["requests"]:
            assert r["error"] is None and sum(r["chunk_tokens"]) == 8 == r["usage"]["completion_tokens"]
            assert r["usage"]["prompt_tokens"] == 16  # the ids were sent as ids, nothing added
            assert r["sent_s"] < r["chunks_s"][0] <= r["chunks_s"][-1] <= r["end_s"]
    assert a["execution"]["effective"]["usage_check"]["ok"]
    m = a["metrics"]
    for name in ("ttft_p50_s", "ttft_p99_s", "tpot_p90_s", "itl_all_p50_s", "e2e_max_s", "request_throughput_req_s",
                 "serve_output_tok_s", "goodput_share", "goodput_req_s"):
        assert len(m[name]["samples"]) == 2 and all(x > 0 for x in m[name]["samples"]), name
    assert m["ttft_p50_s"]["samples"][0] <= m["ttft_p99_s"]["samples"][0] <= m["ttft_max_s"]["samples"][0]
    assert m["goodput_share"]["samples"] == [1.0, 1.0]  # tiny-llama meets bounds of seconds
    assert a["engine"]["build"]["binary"] == "llama-server" and len(a["engine"]["build"]["binary_sha256"]) == 64


def test_a_poisson_rate_is_sent_on_its_schedule_and_its_rate_read_back(served):
    a = served[1]
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    rate = a["execution"]["settings"]["load.rate"]
    assert rate["requested"] == 8 and rate["rule"].startswith("observe only")
    assert rate["effective"][0] > 0
    recs = a["serving"]["repetitions"][0]["requests"]
    from harness import serving
    sched = serving.arrivals(serving.Load(requests=10, rate=8, arrival="poisson", seed=1))
    assert [r["scheduled_s"] for r in recs] == pytest.approx(sched)
    assert all(r["sent_s"] >= r["scheduled_s"] for r in recs)
    check = a["execution"]["effective"]["schedule"][0]
    assert check["open_loop"] and "late_sends" in check
    assert a["execution"]["effective"]["achieved"][0]["rate_req_s"] == pytest.approx(rate["effective"][0])


def test_vllm_bench_serve_sends_the_same_load_and_its_medians_are_ours(served):
    """The cross-check's client: vLLM's serving benchmark sends the harness's prompts at concurrency 2; its
    per-request results become records of the same shape, and the metrics computed from them by the harness's
    definitions equal the medians vLLM prints itself (TTFT, pooled ITL)."""
    a = served[4]
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    eff, s = a["execution"]["effective"], a["execution"]["settings"]
    assert eff["client"].startswith("vllm bench serve")
    assert s["load.concurrency"]["effective"] == 2
    rep = a["serving"]["repetitions"][0]
    assert len(rep["requests"]) == 6 and rep["most_in_flight"] == 2
    for r in rep["requests"]:
        # vLLM times every chunk of the stream: llama-server's last one carries no token, so it may time one more
        assert r["error"] is None and r["usage"]["completion_tokens"] == 8 <= len(r["chunks_s"]) <= 9
        assert r["usage"]["prompt_tokens"] == 16  # vLLM sent the harness's ids as ids
        assert r["sent_s"] < r["chunks_s"][0] <= r["chunks_s"][-1] <= r["end_s"] + 1e-9
    tool, m = eff["tool_report"][0], a["metrics"]
    assert tool["completed"] == 6 and tool["failed"] == 0
    assert m["ttft_p50_s"]["samples"][0] * 1e3 == pytest.approx(tool["median_ttft_ms"], rel=1e-9)
    assert m["itl_all_p50_s"]["samples"][0] * 1e3 == pytest.approx(tool["median_itl_ms"], rel=1e-9)


def test_a_rate_sweep_sends_its_point_at_the_rate_its_probes_measured(served):
    """sync (one at a time) and max (every request at once) run first in the pass; the point between them is
    sent at their midpoint, which its artifact records with the probes it came from; one server size for all."""
    sweep = served[5]
    assert sorted(sweep) == ["max", "sweep-1of1", "sync"]
    for a in sweep.values():
        assert a["status"] == "ok", a.get("error")
        assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
        assert a["execution"]["settings"]["options.parallel"]["effective"] == 4  # the max probe's 4 at once
    sync, top, mid = sweep["sync"], sweep["max"], sweep["sweep-1of1"]
    assert sync["grid"]["position"] < top["grid"]["position"] < mid["grid"]["position"]
    assert sync["workload"]["load"] == {"requests": 4, "concurrency": 1, "sweep": {"point": "sync"}}
    assert top["execution"]["settings"]["load.concurrency"]["effective"] == 4
    import statistics
    req_s = {k: statistics.median(sweep[k]["metrics"]["request_throughput_req_s"]["samples"]) for k in ("sync", "max")}
    got = mid["workload"]["load"]["sweep"]
    assert got["rate_req_s"] == pytest.approx((req_s["sync"] + req_s["max"]) / 2)
    assert mid["workload"]["load"]["rate"] == got["rate_req_s"] == mid["execution"]["settings"]["load.rate"]["requested"]
    assert got["from"]["llama-server"]["sync"]["artifact"] == sync["id"]
    assert got["from"]["llama-server"]["max"]["artifact"] == top["id"]
    assert mid["serving"]["repetitions"][0]["requests"][1]["scheduled_s"] > 0  # an open loop, on a schedule


def test_check_recomputes_a_sweep_points_rate_from_the_probes_it_names(served, tmp_path):
    """harness check reads the point with its probes: the store as written passes; a point whose rate was
    edited (its id recomputed), or that is checked without its probes, does not."""
    import shutil
    from harness import check
    from harness.artifact import compute_id
    src = served[6]
    n, problems = check.check([str(src)])
    assert n == 3 and [p for p in problems if ": harness.dirty:" not in p] == []
    forged = tmp_path / "forged"
    shutil.copytree(src, forged)
    mid = served[5]["sweep-1of1"]
    edited = json.loads(json.dumps(mid))
    edited["workload"]["load"]["sweep"]["rate_req_s"] *= 2
    edited["workload"]["load"]["rate"] = edited["workload"]["load"]["sweep"]["rate_req_s"]
    edited["execution"]["settings"]["load.rate"]["requested"] = edited["workload"]["load"]["rate"]
    edited["id"] = compute_id(edited)
    (forged / f"{mid['id']}.json").unlink()
    (forged / f"{edited['id']}.json").write_text(json.dumps(edited))
    _, problems = check.check([str(forged)])
    assert any("workload.load.sweep: rate" in p and "is not" in p for p in problems), problems
    (forged / f"{edited['id']}.json").unlink()
    edited["workload"]["load"]["sweep"] = "x"  # not a mapping: reported in one line, nothing read from it
    edited["id"] = compute_id(edited)
    (forged / f"{edited['id']}.json").write_text(json.dumps(edited))
    _, problems = check.check([str(forged)])
    assert any("workload.load.sweep: must be a mapping" in p for p in problems), problems
    from harness import analysis, artifact
    arts = [artifact.parse(json.loads(p.read_text()), p.name) for p in forged.glob("*.json")]
    assert analysis.sweep_view(arts, "llama-server") is not None  # the page renders beside it
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(src / f"{mid['id']}.json", alone)
    _, problems = check.check([str(alone)])
    assert any("is not among the checked artifacts" in p for p in problems), problems


def test_no_server_is_left_after_the_runs(served):
    assert served[2] == set() and served[3] == set()


def test_a_server_that_does_not_start_is_a_failed_artifact_with_its_log(tmp_path):
    a = _run(tmp_path, "broken", "{concurrency: 1, requests: 1}", env=", env: {LLAMA_ARG_CTX_SIZE: not-a-number}")
    assert a["status"] == "failed"
    assert "exited" in a["error"] and "before it was ready" in a["error"]
    # the server's own last words, in the error and in the stored log tail
    assert 'environment variable "LLAMA_ARG_CTX_SIZE"' in a["error"]
    assert 'environment variable "LLAMA_ARG_CTX_SIZE"' in a["stderr_tail"]
    assert a["metrics"] == {} and a["engine"]["build"]["binary"] == "llama-server"


def test_kill_9_of_the_runner_kills_its_server(tmp_path):
    g = tmp_path / "long.yaml"
    g.write_text(GRID.format(name="long", load="{concurrency: 1, requests: 2000}", reps=1, env=""))
    import uuid
    mark = uuid.uuid4().hex
    before = set(_server_pids(mark))
    runner = subprocess.Popen([str(Path(sys.executable).parent / "harness"), "run", str(g), "--store", str(tmp_path / "st")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, MARK: mark})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not set(_server_pids(mark)) - before:
            time.sleep(0.2)  # waiting for another process to start (no event to wait on): bounded
        new = set(_server_pids(mark)) - before
        assert new, "the server never started"
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and set(_server_pids(mark)) & new:
            time.sleep(0.1)
        assert not set(_server_pids(mark)) & new, "llama-server outlived a kill -9 of its runner"
    finally:
        for pid in set(_server_pids(mark)) - before:
            os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()


def test_vllm_server_with_the_patched_runtime_at_a_capped_poisson_rate(tmp_path):
    """One vLLM server start (tens of seconds): Poisson arrivals, at most 2 in flight, read back from its log and
    /v1/models, the runtime's patches recorded by each of its processes; nothing left after."""
    g = tmp_path / "vs.yaml"
    g.write_text(GRID.format(name="vs", load="{rate: 8, arrival: poisson, concurrency: 2, requests: 8, shared_prefix: 12}",
                             reps=1, env="")
                 .replace("{name: llama-server, engine: llama-server, form: gguf-f32}",
                          "{name: vllm-server, engine: vllm-server, form: hf-fp32, options: {prefix_cache: true}}")
                 .replace("timeout_s: 120", "timeout_s: 300"))
    execute.run_grid(str(g), store_root=tmp_path / "store")
    (a,) = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("vs")]
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    s = a["execution"]["settings"]
    for name in ("threads", "cpus", "dtype", "context_len", "options.eager", "options.prefix_cache"):
        assert s[name]["rule"] == "enforced" and s[name]["effective"] == s[name]["requested"], (name, s[name])
    eff = a["execution"]["effective"]
    # the prefix cache on, read back from vLLM's config line; every request says how many tokens it took from it
    # (prompt_tokens_details: whole 128-token blocks only, so none of a 16-token prompt)
    assert eff["enable_prefix_caching"] == "True" and eff["cache"]["requests_reporting"] == 8 + 0
    assert a["metrics"]["cache_hit_share"]["samples"] == [eff["cache"]["cached_tokens"] / (16 * 8)]
    assert "threads-follow-bind" in eff["patches_applied"] and len(eff["runtime_records"]) >= 2  # API server, core
    rep = a["serving"]["repetitions"][0]
    assert len(rep["requests"]) == 8 and rep["most_in_flight"] <= 2
    for r in rep["requests"]:  # vLLM's API server may put several tokens in one chunk when it falls behind (load)
        assert r["error"] is None and sum(r["chunk_tokens"]) == 8 == r["usage"]["completion_tokens"]
        assert all(n >= 1 for n in r["chunk_tokens"]) and len(r["chunks_s"]) == len(r["chunk_tokens"])
    assert eff["usage_check"]["ok"] and a["metrics"]["goodput_share"]["samples"] == [1.0]
    assert a["workload"]["load"] == {"requests": 8, "concurrency": 2, "rate": 8, "arrival": "poisson",
                                     "burstiness": 1.0, "seed": 0, "shared_prefix": 12}
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, str(tmp_path))]
    assert left == [], "a process of the vLLM server outlived its run"


def _cmdline_has(p: Path, text: str) -> bool:
    try:
        return text.encode() in (p / "cmdline").read_bytes()
    except OSError:
        return False


@contextlib.contextmanager
def _llama_server_by_hand(tmp_path, slots):
    """A llama-server on tiny-llama started here, not by the harness (an endpoint it does not start): its port,
    once it answers /health (a bounded wait); killed after."""
    from harness import models
    from harness.engines.llamacpp import build as llamacpp_build
    from harness.engines.server.worker import free_port, get_json
    with llamacpp_build.server():
        exe = llamacpp_build.binary("llama-server")
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    srv = subprocess.Popen([str(exe), "-m", str(models.form_path("tiny-llama", "gguf-f32")), "--host", "127.0.0.1",
                            "--port", str(port), "-t", "1", "-c", "512", "-np", str(slots), "--no-ui"], stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if get_json(f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        yield port
    finally:
        srv.kill()
        srv.wait()
        log.close()


def test_an_endpoint_the_harness_does_not_start_is_recorded_as_external(tmp_path):
    with _llama_server_by_hand(tmp_path, 2) as port:
        g = tmp_path / "ext.yaml"
        g.write_text(GRID.format(name="ext", load="{concurrency: 2, requests: 4}", reps=1, env="").replace(
            "{name: llama-server, engine: llama-server, form: gguf-f32}",
            f"{{name: ext, engine: openai, options: {{url: 'http://127.0.0.1:{port}'}}}}"))
        execute.run_grid(str(g), store_root=tmp_path / "store")
        (a,) = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("ext")]
    assert a["status"] == "ok", a.get("error")
    assert a["engine"]["build_commit"] == "external: build not verified"
    assert a["engine"]["build"]["url"] == f"http://127.0.0.1:{port}"
    assert a["execution"]["settings"]["threads"]["rule"].startswith("observe only")
    assert a["execution"]["effective"]["reported"]["/v1/models"]["data"]
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    assert len(a["serving"]["repetitions"][0]["requests"]) == 4



def test_a_shared_prefix_with_the_cache_on_is_hit_and_the_hit_is_read_back(tmp_path, served):
    """workload.load.shared_prefix: every prompt opens with the same 12 tokens; with prefix_cache on, llama-server
    reuses them (cache_prompt) and says so per request (usage.prompt_tokens_details.cached_tokens): the cached
    tokens reach the artifact, cache_hit_share is their share, the setting is read back from them. With the cache
    off (the closed loop above: no shared prefix), every request reports 0 and no hit was possible."""
    a = _run(tmp_path, "prefix", "{concurrency: 2, requests: 6, shared_prefix: 12}",
             env=", options: {prefix_cache: true}")
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    assert a["workload"]["load"]["shared_prefix"] == 12
    (rep,) = a["serving"]["repetitions"]
    cached = [r["usage"]["cached_tokens"] for r in rep["requests"]]
    assert all(0 <= c <= 15 for c in cached) and sum(c >= 12 for c in cached) >= 4, cached  # the slots warm up
    c = a["execution"]["effective"]["cache"]
    assert c["possible"] and c["prefix_cache"] is True and c["cached_tokens"] == sum(cached) and "flag" not in c
    assert a["execution"]["settings"]["options.prefix_cache"]["effective"] is True
    assert a["metrics"]["cache_hit_share"]["samples"] == [pytest.approx(sum(cached) / (16 * 6))]
    off = served[0]  # cache off, no shared prefix
    assert off["execution"]["effective"]["cache"]["possible"] is False
    assert off["metrics"]["cache_hit_share"]["samples"] == [0.0, 0.0]
    assert "options.prefix_cache" not in off["execution"]["settings"]  # nothing to observe without a shared prefix


def test_a_shared_prefix_as_long_as_the_prompt_is_one_line(tmp_path):
    from harness.errors import UserError
    from harness import grid
    g = tmp_path / "bad.yaml"
    g.write_text(GRID.format(name="bad", load="{concurrency: 2, requests: 6, shared_prefix: 16}", reps=1, env=""))
    with pytest.raises(UserError, match="workload.load.shared_prefix: 16 tokens leave no tokens"):
        grid.load(str(g))


def test_conversations_resend_their_history_and_the_cache_takes_it(tmp_path):
    """A conversation load against a real llama-server (cache on): 3 conversations of 3 turns, 2 users. Each later
    turn's prompt is the turn before's prompt, its reply (as the server gave it, tokenized with the model's
    tokenizer) and 4 new tokens: the server's own prompt count says so, and its cache, holding the turn before,
    serves at least that turn's prompt. Per-turn TTFT figures; a turn's failure leaves its later turns unsent."""
    a = _run(tmp_path, "conv", "{concurrency: 2, conversations: 3, turns: 3, user_len: 4, think_s: 0.05}",
             env=", options: {prefix_cache: true, parallel: 2}")
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    assert a["workload"]["load"] == {"requests": 9, "concurrency": 2, "turns": 3, "user_len": 4, "think_s": 0.05}
    (rep,) = a["serving"]["repetitions"]
    recs = rep["requests"]
    assert len(recs) == 9 and rep["most_in_flight"] == 2
    by = {(r["conversation"], r["turn"]): r for r in recs}
    for c in range(3):
        assert by[(c, 0)]["prompt_tokens"] == 16
        for t in (1, 2):
            before, now = by[(c, t - 1)], by[(c, t)]
            assert now["usage"]["prompt_tokens"] == now["prompt_tokens"]  # what was sent is what the server read
            grew = now["prompt_tokens"] - before["prompt_tokens"] - 4  # the reply, as resent
            assert 1 <= grew <= 3 * 8, (c, t, grew)
            assert now["usage"]["cached_tokens"] >= before["prompt_tokens"] - 1, (c, t, now["usage"])
    m = a["metrics"]
    assert m["ttft_first_turn_p50_s"]["samples"][0] > 0 and m["ttft_later_turns_p50_s"]["samples"][0] > 0
    assert m["cache_hit_share"]["samples"][0] > 0.3


@pytest.mark.parametrize("load, says", [
    ("{concurrency: 2, conversations: 3, turns: 3}", "workload.load.user_len: is required with conversations"),
    ("{concurrency: 2, conversations: 3, turns: 3, user_len: 4, requests: 9}", "workload.load.requests: is conversations x turns"),
    ("{rate: 2, conversations: 3, turns: 3, user_len: 4}", "workload.load.rate: a conversation load is a closed loop"),
    ("{concurrency: 2, conversations: 3, turns: 40, user_len: 4}", "workload.load.turns: a conversation's last turn needs"),
    ("{concurrency: 4, conversations: 3, turns: 2, user_len: 4}", "3 conversations cannot keep 4 users busy"),
    ("{concurrency: 2, requests: 4, turns: 2}", "workload.load.turns: applies to conversations"),
])
def test_a_conversation_load_it_cannot_send_is_one_line(tmp_path, load, says):
    from harness import grid
    from harness.errors import UserError
    g = tmp_path / "bad.yaml"
    g.write_text(GRID.format(name="bad", load=load, reps=1, env=""))
    with pytest.raises(UserError) as e:
        grid.load(str(g))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def _trace(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return p


def test_a_trace_is_replayed_on_its_schedule_with_its_own_lengths(tmp_path):
    """A seeded synthetic trace (harness trace synth) replayed against a real llama-server: each request sent at its
    timestamp, its prompt its input length (its blocks' tokens: two requests with one shared block share their
    first tokens, so the cache on serves them), its output its own length; the trace's sha256 in the artifact."""
    from harness.workloads.serving import traces
    lines = traces.synth(6, 8.0, 3, (12, 16), (2, 6), 4, 1, 2)  # every prompt opens with the same 8 tokens
    _trace(tmp_path, lines)
    a = _run(tmp_path, "trace", "{trace: t.jsonl, block_len: 4}", env=", options: {prefix_cache: true}")
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    load = a["workload"]["load"]
    assert load["trace"] == "t.jsonl" and len(load["trace_sha256"]) == 64 and load["requests"] == 6
    (rep,) = a["serving"]["repetitions"]
    for r, d in zip(rep["requests"], lines):
        assert r["scheduled_s"] == pytest.approx(d["timestamp"] / 1000.0) and r["sent_s"] >= r["scheduled_s"] - 1e-3
        assert r["prompt_tokens"] == d["input_length"] == r["usage"]["prompt_tokens"]
        assert r["asked"] == d["output_length"] == r["usage"]["completion_tokens"]
    eff = a["execution"]["effective"]
    assert eff["schedule"][0]["open_loop"] and eff["usage_check"]["ok"]
    assert sum(r["usage"]["cached_tokens"] >= 8 for r in rep["requests"][1:]) >= 3  # the shared first blocks


@pytest.mark.parametrize("line, says", [
    ("not json", ":1: not JSON"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 4}', "input_length: must be an integer in [1,"),
    ('{"timestamp": -1, "input_length": 4, "output_length": 4}', "timestamp: must be milliseconds >= 0"),
    ('{"timestamp": 0, "input_length": 4, "output_length": 4, "hash_ids": ["a"]}', "hash_ids[0]: must be an integer"),
    ('{"timestamp": 0, "input_length": 4, "output_length": 4, "tokens": 3}', "tokens: unknown field"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 4}\n{"timestamp": 1, "input_length": 4, "output_length": 4}',
     ":2: timestamp: 1 is before"),
    ('{"timestamp": 0, "input_length": 400, "output_length": 4}', "workload.prompt_len: 16 is below the trace's longest"),
])
def test_a_malformed_trace_is_one_line_naming_its_line(tmp_path, line, says):
    from harness import grid
    from harness.errors import UserError
    (tmp_path / "t.jsonl").write_text(line + "\n")
    g = tmp_path / "g.yaml"
    g.write_text(GRID.format(name="g", load="{trace: t.jsonl}", reps=1, env=""))
    with pytest.raises(UserError) as e:
        grid.load(str(g))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_burstgpt_csv_is_read_as_its_synthetic_jsonl_twin(tmp_path):
    """BurstGPT's CSV form (seconds, no shared blocks): the same requests, times and lengths as the Mooncake JSONL
    synth writes from the same seed; a row of 0 response tokens (BurstGPT's failed request) skipped; a grid plans
    it and its sha256 is recorded."""
    from harness import grid
    from harness.workloads.serving import traces
    lines = traces.synth(5, 4.0, 7, (8, 12), (2, 4), 4, 0, 0)
    csv_text = traces.burstgpt_csv(lines)
    head, *rows = csv_text.splitlines()
    assert head == "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    rows.insert(2, "0.300,ChatGPT,40,0,40,Conversation log")  # a failed request: skipped
    (tmp_path / "b.csv").write_text("\n".join([head, *rows]) + "\n")
    got, sha = traces.read(tmp_path / "b.csv")
    want, _ = traces.read(_trace(tmp_path, lines))
    assert [(r.input_len, r.output_len, r.blocks) for r in got] == [(r.input_len, r.output_len, ()) for r in want]
    assert [r.t_s for r in got] == pytest.approx([r.t_s for r in want], abs=1e-3)
    g = tmp_path / "g.yaml"
    g.write_text(GRID.format(name="g", load="{trace: b.csv}", reps=1, env=""))
    from harness.workloads.serving import grid as serving_grid
    load = serving_grid.load_of(grid.load(str(g)), {})
    assert load.trace_sha256 == sha and load.requests == 5


@pytest.mark.parametrize("text, says", [
    ("Timestamp,Model,Request tokens\n1,a,4\n", "header: 'Response tokens' missing"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nx,a,4,4,8,c\n",
     ":2: Timestamp: must be seconds >= 0"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,a,4,-1,3,c\n",
     ":2: Response tokens: must be an integer in [0,"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,a,4,4,8\n", ":2: 5 columns, the header has 6"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,a,4,4,8,c\n1,a,4,4,8,c\n",
     ":3: Timestamp: 1.0 is before"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,a,4,0,4,c\n", "no requests (every row"),
])
def test_a_malformed_burstgpt_csv_is_one_line_naming_its_row(tmp_path, text, says):
    from harness.errors import UserError
    from harness.workloads.serving import traces
    (tmp_path / "b.csv").write_text(text)
    with pytest.raises(UserError) as e:
        traces.read(tmp_path / "b.csv")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_trace_changed_after_the_plan_fails_its_run(tmp_path):
    from harness import grid
    from harness.workloads.serving import grid as serving_grid
    t = _trace(tmp_path, [{"timestamp": 0, "input_length": 8, "output_length": 2}])
    g = tmp_path / "g.yaml"
    g.write_text(GRID.format(name="g", load="{trace: t.jsonl}", reps=1, env=""))
    spec = grid.load(str(g))
    t.write_text(json.dumps({"timestamp": 0, "input_length": 9, "output_length": 2}) + "\n")
    from harness.engines.server import loadsources
    why = loadsources.of_load(None, serving_grid.load_of(spec, {}), None, "tiny-llama")
    assert isinstance(why, str) and "t.jsonl: changed since the grid was read" in why, why


def test_a_dataset_files_prompts_are_sent_tokenized_with_their_reply_lengths(tmp_path):
    """A ShareGPT-style file against a real llama-server: each record's first human turn tokenized with the model's
    tokenizer and sent as ids, its output forced to its reply's length; a record too long for the caps skipped and
    counted; the file's sha256 in the artifact; a file changed after the plan fails the run."""
    from harness import models
    from harness.serving import tokenizer_of
    recs = [{"conversations": [{"from": "human", "value": "Hello there, how are you?"},
                               {"from": "gpt", "value": "Fine, thanks."}]},
            {"conversations": [{"from": "human", "value": "word " * 200}, {"from": "gpt", "value": "ok"}]},
            {"prompt": "Tell me a joke.", "output": "No."},
            {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Why?"},
                               {"from": "gpt", "value": "Because it is so."}]}]
    (tmp_path / "chats.json").write_text(json.dumps(recs))
    a = _run(tmp_path, "ds", "{concurrency: 2, requests: 3, dataset: chats.json}")
    assert a["status"] == "ok", a.get("error")
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
    tok = tokenizer_of(str(models.form_path("tiny-llama", "hf-fp32")))
    want = [(tok(r[0]), len(tok(r[1]))) for r in (("Hello there, how are you?", "Fine, thanks."),
                                                   ("Tell me a joke.", "No."), ("Why?", "Because it is so."))]
    (rep,) = a["serving"]["repetitions"]
    for r, (ids, out) in zip(rep["requests"], want):
        assert r["prompt_tokens"] == len(ids) == r["usage"]["prompt_tokens"] and r["asked"] == out
    assert a["workload"]["load"]["dataset"] == "chats.json" and len(a["workload"]["load"]["dataset_sha256"]) == 64
    assert a["execution"]["effective"]["dataset"]["skipped"]["prompt_too_long"] == 1


@pytest.mark.parametrize("text, says", [
    ("[1, 2", "chats.json: not JSON"),
    ('[{"conversations": "hi"}]', "record 0: conversations: must be a list"),
    ('[{"conversations": [{"from": "human"}]}]', "record 0: conversations[0]: must be"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "chats.json:2: neither conversations nor prompt"),
    ('[{"conversations": []}]', "no record has a prompt"),
])
def test_a_malformed_dataset_is_one_line_naming_its_record(tmp_path, text, says):
    from harness import grid
    from harness.errors import UserError
    (tmp_path / "chats.json").write_text(text)
    g = tmp_path / "g.yaml"
    g.write_text(GRID.format(name="g", load="{concurrency: 1, requests: 2, dataset: chats.json}", reps=1, env=""))
    with pytest.raises(UserError) as e:
        grid.load(str(g))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_client_only_install_benchmarks_a_real_server(tmp_path):
    """`pip install .` into a fresh virtual environment: no torch, no vLLM; its `harness` benchmarks a real
    llama-server (started here, by hand) through the openai engine, with model: none and the arm's tokenizer, and
    refuses a vLLM arm at plan in one line naming the extra."""
    from harness import models
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("harness", "runtime"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = tmp_path / "client"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # nothing of this checkout
    py = env / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-compile", "--quiet", str(src)], capture_output=True,
                       text=True, timeout=900, env=clean)
    assert r.returncode == 0, r.stderr[-3000:]
    for heavy in ("torch", "vllm", "transformers"):
        assert subprocess.run([str(py), "-c", f"import {heavy}"], capture_output=True, env=clean).returncode != 0, heavy
    with _llama_server_by_hand(tmp_path, 1) as port:
        g = tmp_path / "client.yaml"
        g.write_text(GRID.format(name="client", load="{concurrency: 1, requests: 3}", reps=1, env="")
                     .replace("model: tiny-llama", "model: none").replace(
                         "{name: llama-server, engine: llama-server, form: gguf-f32}",
                         f"{{name: ext, engine: openai, options: {{url: 'http://127.0.0.1:{port}', served_model: tiny, "
                         f"tokenizer: '{models.form_path('tiny-llama', 'hf-fp32')}'}}}}"))
        run = subprocess.run([str(env / "bin" / "harness"), "run", str(g), "--store", str(tmp_path / "store")],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path, env=clean)
    assert run.returncode == 0, run.stderr[-3000:]
    (a,) = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("client")]
    assert a["status"] == "ok", a.get("error")
    (rep,) = a["serving"]["repetitions"]
    assert len(rep["requests"]) == 3 and all(r["usage"]["prompt_tokens"] == 16 for r in rep["requests"])
    v = tmp_path / "v.yaml"
    v.write_text(GRID.format(name="v", load="{concurrency: 1, requests: 3}", reps=1, env="").replace(
        "{name: llama-server, engine: llama-server, form: gguf-f32}", "{name: v, engine: vllm-server, form: hf-fp32}"))
    plan = subprocess.run([str(env / "bin" / "harness"), "plan", str(v)], capture_output=True, text=True, cwd=tmp_path,
                          env=clean)
    assert plan.returncode == 2 and "pip install 'edge-harness[engines]'" in plan.stderr, plan.stderr
    assert len(plan.stderr.strip().splitlines()) == 1, plan.stderr


def test_a_trace_or_dataset_that_is_no_regular_file_is_one_line(tmp_path):
    """A FIFO named as a trace or a dataset would hang a plain read: refused in one line instead."""
    from harness import grid
    from harness.errors import UserError
    os.mkfifo(tmp_path / "t.jsonl")
    for load in ("{trace: t.jsonl}", "{concurrency: 1, requests: 2, dataset: t.jsonl}"):
        g = tmp_path / "g.yaml"
        g.write_text(GRID.format(name="g", load=load, reps=1, env=""))
        with pytest.raises(UserError) as e:
            grid.load(str(g))
        assert "is a FIFO, not a regular file" in str(e.value) and "\n" not in str(e.value), str(e.value)
