"""A background load that drifts: a busy loop whose duty cycle moves linearly over time.

For the planted-effect experiment (docs/methodology.md): it makes the machine slower at the
start of a grid than at its end, the way heat, other tenants or a cooling page cache do.
Usage: python -m harness.drift --seconds 60 --start 0.9 --end 0.0 [--cpu 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.drift")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--start", type=float, required=True, help="duty cycle at the start, 0..1")
    ap.add_argument("--end", type=float, required=True, help="duty cycle at the end, 0..1")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    ap.add_argument("--slice", type=float, default=0.05, help="seconds per busy/idle slice")
    a = ap.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter() - t0
        if t >= a.seconds:
            break
        duty = a.start + (a.end - a.start) * t / a.seconds
        busy_until = time.perf_counter() + duty * a.slice
        while time.perf_counter() < busy_until:
            pass
        time.sleep(max(0.0, (1 - duty) * a.slice))
    return 0


if __name__ == "__main__":
    sys.exit(main())
