"""Run a command while this machine's wall clock gains on its monotonic clock, then put it back.

CLOCK_REALTIME is stepped forward by `--gain` percent of every `--every-ms` (0.6 % in 1 ms steps
by default: what one CI machine's wall clock did against CLOCK_MONOTONIC) for as long as the command
runs, and set back to its offset from CLOCK_MONOTONIC at the start when it ends. Kernel receive stamps are on the wall clock, so
this shows whether a reader keeps them on the run's clock. Needs root (`clock_settime`).

    sudo python benchmarks/wall_clock_gain.py --gain 0.6 -- \\
        python benchmarks/client_fidelity.py --readers kernel --vllm off --concurrency 100
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from itlbench.load.clients.kclock import measure_offset


def _set_offset(base_ns: int, ahead_ns: int) -> None:
    """Wall clock = monotonic clock + `base_ns` + `ahead_ns`: set against the monotonic clock, so the
    time a step takes is not lost at every step (a relative step would lose it each time)."""
    time.clock_settime_ns(time.CLOCK_REALTIME, time.monotonic_ns() + base_ns + ahead_ns)


def gain_while(command: list[str], gain_percent: float, every_ms: float) -> tuple[int, int, float, int]:
    """(the command's exit code, ns the wall clock was ahead at the end as measured, seconds it ran,
    the offset it was set back to)."""
    step_ns = int(gain_percent / 100 * every_ms * 1e6)
    base = measure_offset(time.time_ns, time.monotonic_ns).offset_ns
    _set_offset(base, 0)  # here, not first in the thread: a refusal (no CAP_SYS_TIME) stops the run
    stop, ahead = threading.Event(), [0]

    def stepper() -> None:
        while not stop.wait(every_ms / 1e3):
            ahead[0] += step_ns
            _set_offset(base, ahead[0])

    t0 = time.monotonic()
    thread = threading.Thread(target=stepper, daemon=True)
    thread.start()
    try:
        rc = subprocess.call(command)
    finally:
        stop.set()
        thread.join()
        gained = measure_offset(time.time_ns, time.monotonic_ns).offset_ns - base
        _set_offset(base, 0)
    return rc, gained, time.monotonic() - t0, base


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gain", type=float, default=0.6, help="percent the wall clock gains (default 0.6)")
    p.add_argument("--every-ms", type=float, default=1.0, help="step period in ms (default 1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("command: give the command to run after --")
    if os.geteuid() != 0:
        p.error("stepping the wall clock needs root (clock_settime)")
    try:
        rc, gained, secs, base = gain_while(command, args.gain, args.every_ms)
    except PermissionError:
        p.error("stepping the wall clock was refused (clock_settime needs CAP_SYS_TIME)")
    print(f"wall clock gained {gained / 1e6:.1f} ms over {secs:.1f} s ({gained / 1e7 / secs:.2f} %), "
          f"then set back to CLOCK_REALTIME - CLOCK_MONOTONIC = {base} ns", file=sys.stderr)
    sys.exit(rc)


if __name__ == "__main__":
    main()
