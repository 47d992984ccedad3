"""The load generator and the serving metrics, on a small fake OpenAI server (the client's and the figures' own
logic; the real servers are in tests/test_serving_real.py)."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from harness import metrics, serving
from harness.workloads.serving import views as serving_views
from harness.workloads.serving import grid as serving_grid


class FakeServer:
    """/v1/completions streaming `max_tokens` chunks `gap_s` apart after `ttft_s`, usage last; requests whose
    first prompt id is 666 get HTTP 500; records the most requests it had in flight."""

    def __init__(self, ttft_s: float = 0.02, gap_s: float = 0.005, usage_extra: int = 0, ids_in_chunks: bool = False,
                 usage: int | None = None, stop_after: int | None = None, end_unmarked: bool = False,
                 redirect: bool = False):
        """Misbehaviours: `usage` its claimed count; `stop_after` tokens sent, then a clean end; `end_unmarked`: the
        stream ends without data: [DONE]; `redirect`: a 307 to another path."""
        self.ttft_s, self.gap_s, self.usage_extra, self.ids = ttft_s, gap_s, usage_extra, ids_in_chunks
        self.usage, self.stop_after, self.end_unmarked, self.redirect = usage, stop_after, end_unmarked, redirect
        self.in_flight = self.most = 0
        self.bodies: list[dict] = []

    async def completions(self, request):
        from aiohttp import web
        body = await request.json()
        self.bodies.append(body)
        if body["prompt"][0] == 666:
            return web.Response(status=500, text="boom")
        if self.redirect:
            return web.Response(status=307, headers={"Location": "/v1/elsewhere"})
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(self.ttft_s)
            n = body["max_tokens"] if self.stop_after is None else self.stop_after
            for i in range(n):
                choice = {"text": f"t{i}", "index": 0} | ({"token_ids": [i]} if self.ids else {})
                await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                await asyncio.sleep(self.gap_s)
            if self.end_unmarked:
                await resp.write_eof()
                return resp
            usage = {"prompt_tokens": len(body["prompt"]),
                     "completion_tokens": self.usage if self.usage is not None else n + self.usage_extra}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    def __enter__(self):
        from aiohttp import web
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        ready = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def endpoint(self) -> serving.Endpoint:
        return serving.Endpoint(base_url=f"http://127.0.0.1:{self.port}", model="m", extra={}, timeout_s=30)


def _prompts(n, first=1):
    return [[first + i, 7, 8, 9] for i in range(n)]


def test_closed_loop_keeps_concurrency_and_stamps_every_chunk():
    with FakeServer() as srv:
        out = serving.run_load(srv.endpoint, serving.Load(requests=6, concurrency=2), _prompts(6), _prompts(1, 50), 5)
    assert srv.most == 2 and out["most_in_flight"] == 2
    assert [r["warmup"] for r in out["warmup_requests"]] == [True]
    recs = out["requests"]
    assert [r["i"] for r in recs] == list(range(6))
    for r in recs:
        assert r["error"] is None and len(r["chunks_s"]) == 5 and r["chunk_tokens"] == [1] * 5
        assert r["sent_s"] < r["chunks_s"][0] <= r["chunks_s"][-1] <= r["end_s"]
        assert r["chunks_s"][0] - r["sent_s"] >= 0.02  # the fake's TTFT
        assert r["usage"] == {"prompt_tokens": 4, "completion_tokens": 5}
    # forced length and greedy in every body
    assert all(b["max_tokens"] == 5 and b["ignore_eos"] and b["temperature"] == 0 and b["stream"] for b in srv.bodies)
    assert serving.usage_check(recs, 5)["ok"]


def test_open_loop_sends_on_schedule_whatever_is_in_flight():
    load = serving.Load(requests=8, rate=50.0, arrival="constant")
    with FakeServer(ttft_s=0.1) as srv:  # each request takes longer than the gap: several in flight
        out = serving.run_load(srv.endpoint, load, _prompts(8), [], 3)
    recs = out["requests"]
    sched = serving.arrivals(load)
    assert sched == pytest.approx([i / 50 for i in range(8)])
    for r, t in zip(recs, sched):
        assert r["scheduled_s"] == pytest.approx(t) and r["sent_s"] >= t
    assert out["most_in_flight"] >= 3
    got = serving.achieved(recs)
    sent = [r["sent_s"] for r in recs]
    assert got["rate_req_s"] == pytest.approx(7 / (sent[-1] - sent[0]))
    # never sent early: the last send is not before its time, so only a late first send shortens the span
    assert got["rate_req_s"] <= 7 / (sched[-1] - sent[0]) * (1 + 1e-9)
    assert got["concurrency"] > 2
    assert serving.schedule_check(load, recs)["open_loop"] is True


def test_arrivals_poisson_and_gamma_have_the_asked_mean_and_are_seeded():
    for arrival, b in (("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)):
        load = serving.Load(requests=4001, rate=10.0, arrival=arrival, burstiness=b, seed=3)
        t = serving.arrivals(load)
        gaps = [y - x for x, y in zip(t, t[1:])]
        mean = sum(gaps) / len(gaps)
        cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
        assert mean == pytest.approx(0.1, rel=0.06)
        assert cv == pytest.approx(1 / math.sqrt(b), rel=0.1)  # gamma shape B: coefficient of variation 1/sqrt(B)
        assert serving.arrivals(load) == t
    assert serving.arrivals(serving.Load(requests=3, concurrency=2)) is None


def test_a_late_client_is_flagged_not_blamed_on_the_server():
    load = serving.Load(requests=4, rate=10.0, arrival="constant")
    recs = [{"scheduled_s": i / 10, "sent_s": i / 10 + (0.05 if i >= 2 else 0.0)} for i in range(4)]
    s = serving.schedule_check(load, recs)
    assert s["late_sends"] == 2 and s["client_behind"] is True
    recs = [{"scheduled_s": i / 10, "sent_s": i / 10 + 0.001} for i in range(4)]
    assert serving.schedule_check(load, recs)["client_behind"] is False


def test_errors_are_counted_and_usage_mismatches_flagged():
    prompts = _prompts(4)
    prompts[1] = [666, 1, 2, 3]
    with FakeServer(usage_extra=1) as srv:
        out = serving.run_load(srv.endpoint, serving.Load(requests=4, concurrency=1), prompts, [], 4)
    recs = out["requests"]
    assert recs[1]["error"].startswith("HTTP 500") and not recs[1]["chunks_s"]
    ok = [r for r in recs if not r["error"]]
    u = serving.usage_check(ok, 4)
    assert u["n_mismatched"] == 3 and u["mismatches"][0]["server_tokens"] == 5 and not u["ok"]
    f = metrics.serving_figures(recs, {"ttft_s": 10.0})
    assert f["goodput_share"] == pytest.approx(3 / 4)  # the failed request counts against goodput


def test_a_figure_is_what_the_client_received_never_the_servers_word_alone():
    """A server claiming a million tokens for 4 sent: the client's 4 make the rate, the mismatch is recorded; a
    stream short of the asked tokens, one cut before its end marker, and a redirect are failed requests."""
    load = serving.Load(requests=2, concurrency=1)
    with FakeServer(usage=1_000_000) as srv:
        out = serving.run_load(srv.endpoint, load, _prompts(2), [], 4)
    recs = out["requests"]
    assert not any(r["error"] for r in recs) and not serving.usage_check(recs, 4)["ok"]
    lats = [metrics.request_latencies(r) for r in recs]
    assert [lat["tokens"] for lat in lats] == [4.0, 4.0]
    f = metrics.serving_figures(recs, None)
    span = max(r["end_s"] for r in recs) - min(r["sent_s"] for r in recs)
    assert f["serve_output_tok_s"] == pytest.approx(8 / span)
    for server, says in ((FakeServer(stop_after=2), "a short stream: 2 of 4 output tokens received"),
                         (FakeServer(stop_after=2, usage=4), None),  # several tokens in one chunk: the server vouches
                         (FakeServer(end_unmarked=True), "the stream ended before its end marker"),
                         (FakeServer(redirect=True), "HTTP 307")):
        with server as srv:
            out = serving.run_load(srv.endpoint, load, _prompts(2), [], 4)
        errors = [r["error"] for r in out["requests"]]
        assert all((says in e) if says else e is None for e in errors), errors
        if server.redirect:
            assert len(server.bodies) == 2  # asked once each, never re-sent to where it pointed


def test_a_reachability_check_is_bounded_whole_and_never_redirected():
    import http.server
    import time

    from harness.engines.server.worker import get_json

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/moved":
                self.send_response(307)
                self.send_header("Location", "/health")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):  # a byte a second
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:  # the client gave up, as it should
                pass

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        t0 = time.time()
        with pytest.raises(TimeoutError, match="did not answer whole within 2 s"):
            get_json(base + "/health", timeout=2.0)
        assert time.time() - t0 < 6
        assert get_json(base + "/moved", timeout=2.0) == (307, None)
    finally:
        srv.shutdown()


def test_token_ids_in_chunks_are_counted():
    with FakeServer(ids_in_chunks=True) as srv:
        out = serving.run_load(srv.endpoint, serving.Load(requests=1, concurrency=1), _prompts(1), [], 3)
    assert out["requests"][0]["chunk_tokens"] == [1, 1, 1]


def test_an_unreachable_server_is_an_error_per_request_not_a_crash():
    ep = serving.Endpoint(base_url="http://127.0.0.1:9", model="m", extra={}, timeout_s=5)
    out = serving.run_load(ep, serving.Load(requests=2, concurrency=1), _prompts(2), [], 2)
    assert all(r["error"] for r in out["requests"])
    assert metrics.serving_figures(out["requests"], None) == {}


def _rec(sent, chunks, tokens=None):
    return {"sent_s": sent, "chunks_s": chunks, "chunk_tokens": [1] * len(chunks), "end_s": chunks[-1],
            "usage": {"completion_tokens": tokens or len(chunks)}, "error": None}


def test_serving_figures_by_hand():
    recs = [_rec(0.0, [0.5, 0.6, 0.7]), _rec(1.0, [1.2, 1.4, 1.6, 1.8]), _rec(2.0, [3.0, 3.1])]
    f = metrics.serving_figures(recs, {"ttft_s": 0.6, "e2e_s": 1.0})
    assert f["ttft_p50_s"] == pytest.approx(0.5) and f["ttft_max_s"] == pytest.approx(1.0)
    assert f["ttft_p90_s"] == pytest.approx(0.5 + 0.8 * 0.5)  # linear interpolation over [0.2, 0.5, 1.0]
    assert f["tpot_p50_s"] == pytest.approx(0.1) and f["tpot_max_s"] == pytest.approx(0.2)
    assert f["itl_all_p50_s"] == pytest.approx(0.15)  # gaps 0.1 0.1 0.2 0.2 0.2 0.1: median of six
    assert f["itl_all_max_s"] == pytest.approx(0.2)
    assert f["e2e_max_s"] == pytest.approx(1.1)
    assert f["request_throughput_req_s"] == pytest.approx(3 / 3.1)
    assert f["serve_output_tok_s"] == pytest.approx(9 / 3.1)
    # request 0 (ttft 0.5, e2e 0.7) and 1 (ttft 0.2, e2e 0.8) meet the bounds; 2 (ttft 1.0) does not
    assert f["goodput_share"] == pytest.approx(2 / 3) and f["goodput_req_s"] == pytest.approx(2 / 3.1)
    # TPOT counts the server's tokens: 3 tokens over 2 chunks (a chunk of two)
    assert metrics.request_latencies(_rec(0.0, [1.0, 2.0], tokens=3))["tpot"] == pytest.approx(0.5)


def test_every_serving_metric_has_one_definition_and_no_request_metric_is_redefined():
    assert not set(metrics.SERVING_METRICS) & set(metrics.REQUEST_METRICS)
    m = metrics.from_serving([{"requests": [_rec(0.0, [0.5, 0.6, 0.7])]}], {"tpot_s": 1.0})
    for name, row in m.items():
        unit, hib, definition = metrics.SERVING_METRICS[name]
        assert row["definition"] == definition and row["unit"] == unit and len(row["samples"]) == 1
        assert row.get("higher_is_better", True) is hib


def test_the_load_is_validated_in_one_line(write_grid, cli):
    base = """
    name: s
    model: tiny-llama
    arms: [{name: a, engine: llama-server}]
    workload: {prompt_len: 8, context_len: 64, gen_len: 4, LOAD}
    threads: 1
    """
    cases = [("load: {requests: 4}", "workload.load: names neither concurrency nor rate"),
             ("load: {concurrency: 2}", "workload.load.requests: is required"),
             ("load: {concurrency: 8, requests: 4}", "cannot keep 8 in flight"),
             ("load: {rate: -1, requests: 4}", "workload.load.rate: must be a number"),
             ("load: {rate: 2, arrival: lumpy, requests: 4}", "workload.load.arrival: unknown arrival"),
             ("load: {rate: 2, burstiness: 2, requests: 4}", "workload.load.burstiness: applies to arrival: gamma"),
             ("load: {concurrency: 1, requests: 4, warp: 1}", "workload.load.warp: unknown field"),
             ("load: {concurrency: 1, requests: 4}, slo: {ttft: 1}", "workload.slo.ttft: unknown field"),
             ("batch: 1", "workload.load: is required: arm 'a' runs a server engine")]
    for load, says in cases:
        g = write_grid(base.replace("LOAD", load))
        rc, out, err = cli("plan", g)
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, (load, err)
    g = write_grid(base.replace("LOAD", "load: {concurrency: 1, requests: 4}").replace("llama-server", "llama.cpp"))
    rc, out, err = cli("plan", g)
    assert rc == 2 and "arms[a].engine: llama.cpp runs no load" in err
    # vLLM's serving benchmark has Poisson and gamma arrivals only: refused at plan, not failed at run
    bench = base.replace("engine: llama-server}", "engine: llama-server, options: {client: vllm-bench}}")
    rc, out, err = cli("plan", write_grid(bench.replace("LOAD", "load: {rate: 2, arrival: constant, requests: 4}")))
    assert rc == 2 and "workload.load.arrival: constant arrivals cannot be sent by vllm bench serve" in err, err
    ok = bench.replace("LOAD", "load: {rate: 2, arrival: poisson, requests: 4}").replace("context_len: 64", "context_len: 256")
    rc, out, err = cli("plan", write_grid(ok))
    assert rc == 0, err


def test_an_unreachable_openai_url_is_one_line_at_start_and_nothing_is_stored(write_grid, cli, tmp_path):
    g = write_grid("""
    name: ext
    model: tiny-llama
    arms: [{name: ext, engine: openai, options: {url: "http://127.0.0.1:9"}}]
    workload: {prompt_len: 8, context_len: 64, gen_len: 4, load: {concurrency: 1, requests: 2}}
    threads: 1
    """)
    rc, out, err = cli("run", g, "--store", tmp_path / "st")
    errors = [line for line in err.strip().splitlines() if not line.startswith("[harness]")]
    assert rc == 2 and len(errors) == 1
    assert "arms[ext].options.url: http://127.0.0.1:9 is unreachable" in errors[0]
    assert not list((tmp_path / "st").rglob("*.json"))  # no artifact, not even a failed one
    rc, out, err = cli("plan", write_grid(open(g).read().replace('"http://127.0.0.1:9"', "ftp://x"), "bad.yaml"))
    assert rc == 2 and "arms[ext].options.url" in err


def test_the_load_curve_joins_each_arms_points_in_the_order_of_the_load():
    from harness import analysis, html, report
    rows = lambda metric, vals: {"metric": metric, "unit": "s", "rows": [  # noqa: E731
        {"arm": arm, "cell": f"batch=1,concurrency={c},gen_len=8", "median_value": v, "cell_short": f"concurrency={c}",
         "threads": 2} for (arm, c), v in vals.items()]}
    sec = {"slug": "g-h", "name": "g", "host_key": "h", "baseline": "a", "tables": [
        rows("serve_output_tok_s", {("a", 1): 10.0, ("a", 4): 30.0, ("a", 2): 20.0, ("b", 1): 12.0}),
        rows("ttft_p90_s", {("a", 1): 0.1, ("a", 2): 0.2, ("a", 4): 0.5, ("b", 1): 0.1})]}
    pts = analysis.load_points(sec)
    assert list(pts) == ["ttft_p90_s"]
    assert pts["ttft_p90_s"]["a"] == [(1.0, 10.0, 0.1, "1"), (2.0, 20.0, 0.2, "2"), (4.0, 30.0, 0.5, "4")]
    assert report.plot_names({**sec, "tables": sec["tables"]})[-1] == "g-h-load.png"
    fig = html.load_figure(sec)
    assert fig["data"][0]["x"] == [10.0, 20.0, 30.0] and fig["data"][0]["text"] == ["1", "2", "4"]
    assert analysis.load_of("batch=1,rate=2.5") == ("rate", 2.5, "2.5") and analysis.load_of("batch=1,threads=2") is None
    # a sweep's points lie in the sweep's order, sync to max, labelled by their place between the probes
    sweep = [analysis.load_of(f"batch=1,rate={p}") for p in ("max", "sweep-2of3", "sync", "sweep-1of3")]
    assert sorted(sweep) == [("rate sweep", 0.0, "sync"), ("rate sweep", 0.25, "1/4"), ("rate sweep", 0.5, "2/4"),
                             ("rate sweep", 1.0, "max")]
    one = {**sec, "tables": [rows("serve_output_tok_s", {("a", 1): 1.0}), rows("ttft_p90_s", {("a", 1): 0.1})]}
    assert not any(n.endswith("-load.png") for n in report.plot_names(one))  # one point is no curve


def test_a_goodput_of_zero_gives_no_ratio_and_no_p_value_not_nan():
    """0 / 0 (every request missed the SLO in both arms) has no ratio: the page says so, it prints no 'nan'."""
    from harness import report, stats
    c = stats.compare([0.0, 0.0, 0.0], [0.0, 0.5, 0.0])
    text = report.sections._ratio_text(c)
    assert text.startswith("no ratio") and "nan" not in text
    assert report.sections._ratio_text(stats.compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])) .startswith("1.000")


def test_vllm_bench_client_gets_one_connection_per_request():
    """vLLM's serving benchmark pools keep-alive connections (keepalive_timeout=60, force_close=False); the
    connector the harness hands it closes each one after its request, as the harness's own client does."""
    import asyncio

    import aiohttp

    from harness.engines.server.vllmbench import _one_request_per_connection

    async def make():
        c = _one_request_per_connection(aiohttp.TCPConnector)(limit=2, keepalive_timeout=60, force_close=False)
        try:
            return c.force_close, c.limit
        finally:
            await c.close()
    assert asyncio.run(make()) == (True, 2)
    assert isinstance(aiohttp.TCPConnector, type) and aiohttp.TCPConnector.__name__ == "TCPConnector"


def test_a_rate_sweep_is_cells_probes_first_and_refused_where_it_cannot_run(write_grid, cli):
    from harness import grid
    base = """
    name: s
    model: tiny-llama
    arms: [{name: a, engine: llama-server}, {name: b, engine: llama-server, form: gguf-f16}]
    workload: {prompt_len: 8, context_len: 256, gen_len: 4, LOAD}
    threads: 1
    passes: 2
    """
    spec = grid.load(write_grid(base.replace("LOAD", "load: {rate: sweep, requests: 4}, slo: {ttft_s: 1, share: 0.5}")))
    assert [c.params["rate"] for c in grid.expand(spec)] == ["sync", "max", "sweep-1of3", "sweep-2of3", "sweep-3of3"]
    assert serving_grid.slo(spec) == {"ttft_s": 1.0, "share": 0.5}
    sync, top, mid = (serving_grid.load_of(spec, {"rate": r}) for r in ("sync", "max", "sweep-1of3"))
    assert (sync.concurrency, sync.rate, top.concurrency, top.rate) == (1, None, 4, None)
    assert mid.rate is None and "not resolved" in mid.unresolved  # never sent at a guessed rate
    assert sync.server_slots == top.server_slots == mid.server_slots == 4  # one server size at every point
    got = serving_grid.load_of(spec, {"rate": "sweep-1of3"}, {"point": "sweep-1of3", "rate_req_s": 2.5})
    assert got.rate == 2.5 and got.unresolved is None and got.record()["sweep"]["rate_req_s"] == 2.5
    cases = [("load: {rate: sweep, concurrency: 2, requests: 4}", "workload.load.concurrency: cannot be set beside rate: sweep"),
             ("load: {rate: sweep, points: 2, requests: 4}", "workload.load.points: must be an integer in [3, 20]"),
             ("load: {rate: sweep, points: 3.5, requests: 4}", "workload.load.points: must be an integer"),
             ("load: {rate: 2, points: 4, requests: 4}", "workload.load.points: applies to rate: sweep"),
             ("load: {rate: 2, requests: 4}, slo: {ttft_s: 1, share: 0.5}", "workload.slo.share: applies to a rate sweep"),
             ("load: {rate: sweep, requests: 4}, slo: {share: 0.5}", "workload.slo: gives a share and no bound"),
             ("load: {rate: sweep, requests: 4}, slo: {ttft_s: 1, share: 2}", "workload.slo.share: must be a share")]
    for load, says in cases:
        rc, out, err = cli("plan", write_grid(base.replace("LOAD", load)))
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, (load, err)
    for extra, says in (("axes: {rate: [1, 2]}", "axes.rate: cannot be set beside rate: sweep"),
                        ("order: sequential", "order: a rate sweep runs interleaved")):
        rc, out, err = cli("plan", write_grid(base.replace("LOAD", "load: {rate: sweep, requests: 4}") + extra))
        assert rc == 2 and says in err, (extra, err)


def _art(arm, rate, p, status="ok", req_s=None, good=None, rate_req_s=None, aid=None):
    from types import SimpleNamespace as NS
    params = {"batch": 1, "rate": rate}
    sweep = {"point": rate, **({"rate_req_s": rate_req_s} if rate_req_s is not None else {})}
    metrics_ = {} if status != "ok" else {"request_throughput_req_s": NS(samples=[req_s or 1.0]),
                                          "goodput_share": NS(samples=[1.0 if good is None else good])}
    return NS(id=aid or f"{arm}-{rate}-{p}", status=status, metrics=metrics_,
              grid=NS(arm=arm, pass_index=p, cell=f"batch=1,rate={rate}", cell_params=params),
              workload=NS(load={"requests": 4, "sweep": sweep}, slo={"ttft_s": 1.0, "share": 0.9}))


def test_a_sweep_point_takes_its_rate_from_its_own_passs_probes_of_every_arm(write_grid):
    from harness import grid, sweep
    from harness.schedule import probe_keys, schedule
    spec = grid.load(write_grid("""
    name: s
    model: tiny-llama
    arms: [{name: a, engine: llama-server}, {name: b, engine: llama-server, form: gguf-f16}]
    workload: {prompt_len: 8, context_len: 256, gen_len: 4, load: {rate: sweep, points: 4, requests: 4}}
    threads: 1
    passes: 2
    """))
    runs = schedule(spec)
    key = {(r.cell.params["rate"], r.arm, r.pass_index): r.run_key for r in runs}
    assert all(r.cell.params["rate"] in ("sync", "max") for r in runs if r.pass_index == 0 and r.position < 4)
    done = {key[(probe, arm, 1)]: [_art(arm, probe, 1, req_s=v)] for (probe, arm), v in
            {("sync", "a"): 2.0, ("sync", "b"): 1.0, ("max", "a"): 4.0, ("max", "b"): 7.0}.items()}
    done[key[("sync", "a", 0)]] = [_art("a", "sync", 0, req_s=100.0)]  # another pass's probe: not read
    point = next(r for r in runs if r.pass_index == 1 and r.cell.params["rate"] == "sweep-2of2")
    got = sweep.resolve(point, probe_keys(spec, point), done)
    assert (got["sync_req_s"], got["max_req_s"]) == (1.0, 7.0)  # the slowest unloaded, the fastest saturated
    assert got["rate_req_s"] == pytest.approx(1.0 + 6.0 * 2 / 3) and got["from"]["b"]["max"]["artifact"] == "b-max-1"
    done[key[("max", "b", 1)]] = [_art("b", "max", 1, status="failed")]
    assert "pass 1's max run of arm b failed" in sweep.resolve(point, probe_keys(spec, point), done)["error"]
    del done[key[("max", "b", 1)]]
    assert "has not run" in sweep.resolve(point, probe_keys(spec, point), done)["error"]


def test_the_highest_rate_within_the_slo_per_pass_with_an_interval_and_the_paired_ratio():
    from harness import analysis, sweep
    arts = []
    for p in range(6):
        for arm, top in (("a", 4.0), ("b", 2.0)):  # b misses the SLO at 2/3 of the way and above
            arts += [_art(arm, "sync", p, req_s=1.0), _art(arm, "max", p, req_s=top + p / 10, good=0.5),
                     _art(arm, "sweep-1of2", p, rate_req_s=2.0 + p / 10),
                     _art(arm, "sweep-2of2", p, rate_req_s=3.0 + p / 10, good=1.0 if arm == "a" else 0.8)]
    cap = sweep.capacity(arts, 0.9)
    assert cap["a"] == {p: 3.0 + p / 10 for p in range(6)} and cap["b"] == {p: 2.0 + p / 10 for p in range(6)}
    arts[-1] = _art("b", "sweep-2of2", 5, status="failed")  # a pass with a point unknown has no highest rate
    assert 5 not in sweep.capacity(arts, 0.9)["b"]
    arts[-1] = _art("b", "sweep-2of2", 5, rate_req_s=3.5, good=0.8)
    v = analysis.sweep_view(arts, "a")
    a, b = v.rows
    assert (a.arm, b.arm, len(a.values)) == ("a", "b", 6) and a.median_ci == (3.0, 3.5)  # n=6: the range at 95%
    assert a.vs_baseline is None and b.vs_baseline.ratio < 1 and b.vs_baseline.has_interval
    assert [(r.point, r.n) for r in v.rates] == [("sweep-1of2", 6), ("sweep-2of2", 6)] and v.share == 0.9


def test_the_crosscheck_page_puts_vllms_printed_medians_beside_the_harnesss():
    from types import SimpleNamespace as NS
    from harness import analysis, report

    def art(arm, p, ttft, printed=None):
        eff = {"tool_report": [{"median_ttft_ms": printed, "median_itl_ms": 20.0, "median_tpot_ms": "n/a"}]} \
            if printed is not None else {}
        return NS(status="ok", workload=NS(load={"requests": 4}), execution=NS(effective=eff), engine=NS(name="vllm-server"),
                  grid=NS(cell="batch=1,concurrency=4", arm=arm, pass_index=p),
                  metrics={"ttft_p50_s": NS(samples=[ttft]), "itl_all_p50_s": NS(samples=[0.02])})
    series = [art("harness", p, 0.1 + p / 100) for p in range(3)] + [art("bench", p, 0.2, 200.0 + p) for p in range(3)]
    bench, ours = analysis.tool_medians(series)
    assert (bench.arm, bench.client, ours.client, bench.n) == ("bench", "vllm-bench", "harness", 3)
    assert bench.printed == {"ttft_p50_s": pytest.approx(0.201), "itl_all_p50_s": pytest.approx(0.02)}  # "n/a" left out
    assert ours.printed == {} and ours.ours["ttft_p50_s"] == pytest.approx(0.11) and "tpot_p50_s" not in ours.ours
    rows = serving_views.tools(series)
    assert rows[0]["ttft_p50_s_printed"] == "201" and rows[1]["ttft_p50_s"] == "110" and rows[1]["tpot_p50_s"] == ""
    assert analysis.tool_medians(series[:3]) == []  # no vllm-bench arm: no such table
