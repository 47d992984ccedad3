"""The serving worker: one process per run that starts the server (where the harness starts one), waits until it
is ready, reads back what it says of itself, sends the load (harness/serving.py) and stops it. Given a fidelity
request instead of a load, it answers that through the server's API (fidelity.py).

    python -m harness.engines.server.worker REQUEST.json RESULT.json

The server is this process's child, in its session and carrying its containment mark (harness/lifecycle.py):
when this worker ends, is killed, or its runner is, the server ends with it. It listens on 127.0.0.1 only, on
a port chosen free just before it starts (`{port}` in its command). A server that exits before it is ready,
or is not ready within the run's time, fails the run with its log's last lines (on stderr and in the result).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# started as a script: its folder (harness/engines/server, which holds fidelity.py) must not stand in front of the
# real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from harness import serving  # noqa: E402

LOG_TAIL_LINES = 30


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer (its 3xx status), never followed: what the artifact names is what answered."""

    def redirect_request(self, *a: Any, **k: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
MAX_ANSWER = 8 << 20


def get_json(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, Any]:
    """GET `url`: (status, its JSON or text), the whole answer within `timeout` (each read waits at most `timeout`
    and none starts after it: a server answering a byte a second is cut off, not only one that never starts), a
    redirect not followed."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            status, parts, n = r.status, [], 0
            while n < MAX_ANSWER:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{url} did not answer whole within {timeout:g} s")
                part = r.read1(min(65536, MAX_ANSWER - n))
                if not part:
                    break
                parts.append(part)
                n += len(part)
            body = b"".join(parts)
    except urllib.error.HTTPError as e:
        return e.code, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")[:2000]


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - (256 << 10)))
            return "\n".join(f.read().decode(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def log_matches(path: Path, patterns: list[str], limit: int = 64 << 20) -> dict[str, str | None]:
    """Each pattern's first matching line of the server log (its settings are printed once, at start)."""
    import re
    res = {p: None for p in patterns}
    rx = {p: re.compile(p) for p in patterns}
    try:
        with open(path, "rb") as f:
            for raw in f:
                line = raw.decode(errors="replace").rstrip("\n")
                for p, r in rx.items():
                    if res[p] is None and r.search(line):
                        res[p] = line[:20000]
                if all(v is not None for v in res.values()) or f.tell() > limit:
                    break
    except OSError:
        pass
    return res


def wait_ready(proc: subprocess.Popen | None, base: str, health: str, deadline: float, log: Path | None,
               api_key: str | None) -> str | None:
    """None once `health` answers 200; else why not (the server exited, or the deadline passed)."""
    last = "no answer"
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log) if log else ""
            return f"the server exited {proc.returncode} before it was ready: {tail.splitlines()[-1] if tail else ''}"
        try:
            status, _ = get_json(base + health, timeout=2.0, api_key=api_key)
            if status == 200:
                return None
            last = f"HTTP {status}"
        except (OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.1)
    return f"the server was not ready within the run's time ({last} from {health})"


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """SIGTERM the server's process group, then SIGKILL what is left after grace_s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        pass
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        return proc.wait()


def _send(req: dict, ep: Any, load: Any, rep: dict, tokenize: Any) -> dict:
    """One repetition's load, sent by the harness's client or by vllm bench serve (the cross-check)."""
    if req.get("client") == "vllm-bench":
        from harness.engines.server.vllmbench import run as vllm_bench
        return vllm_bench(ep, load, rep["prompts"], rep["warmup_prompts"], int(req["gen_len"]), req.get("tokenizer"))
    return serving.run_load(ep, load, rep["prompts"], rep["warmup_prompts"], int(req["gen_len"]), rep.get("users"),
                            tokenize, rep.get("gen_lens"), rep.get("schedule"))


def main(req_path: str, out_path: str) -> int:
    req = json.loads(Path(req_path).read_text())
    out = Path(out_path)
    deadline = time.time() + float(req["timeout_s"])
    api_key = os.environ.get(req["api_key_env"]) if req.get("api_key_env") else None
    proc = None
    log = None
    result: dict[str, Any] = {"status": "failed", "client_affinity": sorted(os.sched_getaffinity(0))}
    t0 = time.time()
    try:
        srv = req.get("server")
        if srv is not None:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            cmd = [a.replace("{port}", str(port)) for a in srv["cmd"]]
            log = Path(srv["log"])
            with open(log, "wb") as f:
                # its own process group (stopped as one), in this worker's session: contained with it
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **srv["env"]},
                                        process_group=0)
            result |= {"command": cmd, "port": port, "server_pid": proc.pid}
        else:
            base = req["url"].rstrip("/")
        why = wait_ready(proc, base, req["health"], deadline, log, api_key)
        result["ready_s"] = time.time() - t0
        if why is not None:
            result["error"] = why
            return 1
        if proc is not None:
            try:
                result["server_affinity"] = sorted(os.sched_getaffinity(proc.pid))
            except OSError:
                result["server_affinity"] = None
        info = {}
        for path in req.get("info_paths", []):
            status, body = get_json(base + path, api_key=api_key)
            info[path] = body if status == 200 else {"http_status": status}
        result["info"] = info
        if req.get("fidelity") is not None:  # harness fidelity: greedy and teacher-forced, one request at a time
            from harness.engines.server.fidelity import answer, effective
            result |= answer(req["dialect"], base, req["model"], req["fidelity"], max(1.0, deadline - time.time()))
            if log is not None:
                result["log_matches"] = log_matches(log, req.get("log_patterns", []))
            result["effective"] = effective(req["dialect"], info, result.get("log_matches") or {},
                                                     result.get("server_affinity"))
            result["status"] = "ok"
            return 0
        load = serving.Load(**req["load"])
        ep = serving.Endpoint(base_url=base, model=req["model"], extra=req.get("extra", {}), api_key=api_key,
                              timeout_s=max(1.0, deadline - time.time()))
        reps = []
        tok = serving.tokenizer_of(req.get("tokenizer")) if load.turns > 1 else None
        for i, rep in enumerate(req["repetitions"]):
            reps.append(_send(req, ep, load, rep, tok))
            if time.time() > deadline:
                result["error"] = f"the run's time ran out after {i + 1} of {len(req['repetitions'])} repetitions"
                result["status"] = "timeout"
                return 1
        result |= {"status": "ok", "repetitions": reps}
        return 0
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        return 1
    finally:
        if proc is not None:
            result["exit_code"] = stop(proc)
            rec_dir = (srv or {}).get("env", {}).get("EDGE_HARNESS_RECORD_DIR")  # the runtime's own record, per process
            if rec_dir and req.get("fidelity") is not None:
                result["runtime_records"] = [json.loads(p.read_text()) for p in sorted(Path(rec_dir).glob("*.json"))]
        if log is not None:
            result["log_tail"] = log_tail(log)
            result["log_matches"] = log_matches(log, req.get("log_patterns", []))
            if result.get("status") != "ok":
                print(result["log_tail"], file=sys.stderr)
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
