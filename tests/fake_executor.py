"""A fake executor for the execution loop's own tests (harness/execute.py): deterministic clock and results.

It starts no process: each run advances its clock by `step_s` and returns a real run artifact of the grid's
command arm (samples derived from the run key, so two runs of one key give the same numbers), built by the
same typed builder as a real run, on the fake machine's own host (a host block whose identity is the
machine's name, so its key is consistent and differs per machine). `script` maps (machine, index of that
machine's call: 0, 1, ...) to what happens to that run instead: "failed", "lost" (the machine is lost while it
runs), "refused", "interrupt" (Ctrl-C on the driver). Each machine has its own clock (the loop runs machines in
threads), so what a machine sees does not depend on how threads interleave. Its artifacts are for temporary
stores of tests only.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from harness import provenance, runner
from harness.engines.base import EngineResult, failed, setting
from harness.execute import Lost, Machine, Refused
from harness.probe import host_key

T0 = 1_800_000_000.0  # 2027-01-15: the fake clock's start


def fake_host(name: str) -> dict:
    """This machine's probe record under another identity: a host of its own, with a key consistent with it."""
    host = {**provenance.host_static(), "memory": provenance.host_info()["memory"]}
    host["identity"] = {**host["identity"], "sha256": hashlib.sha256(f"fake machine {name}".encode()).hexdigest()}
    host["key"] = host_key(host)
    host["loadavg"] = [0.0, 0.0, 0.0]
    return host


class Fake:
    name = "fake"

    def __init__(self, machines: list[tuple[str, str]] = (("m1", "A"),), step_s: float = 2.0,
                 script: dict[tuple[str, int], str] | None = None, refuse: set[str] = frozenset(),
                 recover: bool = False):
        self.local = threading.local()
        self.lock = threading.Lock()
        self.step_s = step_s
        self.script = dict(script or {})
        self.refuse, self.can_recover = set(refuse), recover
        self.hosts = {name: fake_host(name) for name, _ in machines}
        self.classes = dict(machines)
        self.calls: list[tuple[str, str]] = []  # (machine label, run key), in the order the loop asked
        self.recovered: list[str] = []
        self.closed = self.interrupted = False

    def clock(self) -> float:
        return getattr(self.local, "t", T0)

    def machines(self, spec) -> list[Machine]:
        return [Machine(key=h["key"], cls=self.classes[name], label=name, keys={h["key"]},
                        info={"host": h, "executor": {"name": "fake", "machine": name}})
                for name, h in self.hosts.items()]

    def prepare(self, m: Machine, spec) -> None:
        if m.label in self.refuse:
            raise Refused(f"{m.label} cannot prepare (fake)")

    def run(self, m: Machine, spec, run, store_root: Path) -> Any:
        with self.lock:
            event = self.script.get((m.label, sum(1 for who, _ in self.calls if who == m.label)))
            self.calls.append((m.label, run.run_key))
        t0 = self.clock()
        self.local.t = t1 = t0 + self.step_s
        if event == "interrupt":
            raise KeyboardInterrupt
        if event == "lost":
            raise Lost(f"{m.label} went away (fake)")
        if event == "refused":
            raise Refused(f"{m.label} refuses (fake)")
        arm = spec.arm(run.arm)
        threads = runner.threads_of(arm, run.cell.params)
        seed = int(hashlib.sha256(run.run_key.encode()).hexdigest()[:8], 16)
        engine = {"name": arm.engine, "version": "n/a", "build_commit": "n/a (fake executor)", "build": {"fake": True}}
        if event == "failed":
            res = failed("failed", "fake failure", ["fake"], {}, engine=engine, requested={"threads": threads})
        else:
            walls = [1.0 + (seed % 1000) / 10_000 + i / 1000 for i in range(spec.repetitions)]
            res = EngineResult(
                status="ok", engine=engine, requested={"threads": threads}, effective={"threads": threads},
                metrics={"wall_s": {"unit": "s", "samples": walls, "warmup_samples": [], "higher_is_better": False,
                                    "definition": "wall time of one fresh /bin/sh -c process, start to exit, per "
                                                  "repetition"}},
                settings={"warmups": setting(spec.warmups, spec.warmups, "fake executor")}, command=["fake"], env={},
                peak_memory={"status": "unknown"}, after_load={"status": "n/a", "reason": "fake"},
                prompt_token_hash="n/a (command engine)")
        host = {k: v for k, v in m.info["host"].items() if k != "loadavg"}
        host |= {"loadavg_before": [0.0, 0.0, 0.0], "loadavg_after": [0.0, 0.0, 0.0],
                "other_load_during_run": {"status": "unknown", "reason": "fake executor"}}
        from harness.execute import iso
        timing = {"start": iso(t0), "end": iso(t1), "duration_s": self.step_s}
        return runner.document(spec, run, res, host, timing, model_block=runner.model_block("none", "none")[0],
                               threads=threads, cpus=[0], env={"HARNESS_EXECUTOR": "fake"}, executor=m.info["executor"])

    def recover(self, m: Machine) -> bool:
        self.recovered.append(m.label)
        return self.can_recover

    def interrupt(self) -> None:
        self.interrupted = True

    def close(self) -> None:
        self.closed = True
