"""Kernel receive stamps and their mapping onto the run clock (perf_counter_ns)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from itlbench.load.clients.kclock import (
    ANCILLARY_SIZE,
    SCM_TIMESTAMPNS,
    TIMESPEC,
    KernelClock,
    enable_rx_timestamps,
    kernel_stamps_available,
    measure_offset,
)

needs_kernel_stamps = pytest.mark.skipif(kernel_stamps_available() is not None,
                                         reason=str(kernel_stamps_available()))


def _can_set_wall_clock() -> bool:
    """Root with CAP_SYS_TIME: setting CLOCK_REALTIME to its own reading (a step of a few µs back) works."""
    if os.geteuid() != 0:
        return False
    try:
        time.clock_settime_ns(time.CLOCK_REALTIME, time.clock_gettime_ns(time.CLOCK_REALTIME))
    except OSError:
        return False
    return True


needs_clock_setting = pytest.mark.skipif(not _can_set_wall_clock(), reason="stepping the wall clock needs root "
                                         "with CAP_SYS_TIME")
OFFSET = 1_700_000_000_123_456_789  # a wall clock about 2023, against a monotonic clock near zero


class FakeClocks:
    """A run clock that advances unevenly on every read, and a realtime clock = run + offset (+ steps)."""

    def __init__(self, offset: int) -> None:
        self.t = 5_000_000
        self.offset = offset
        self.reads = 0

    def run_ns(self) -> int:
        self.reads += 1
        self.t += 40 + (self.reads * 37) % 300  # reads take 40-340 ns
        return self.t

    def realtime_ns(self) -> int:
        self.t += 25
        return self.t + self.offset


def test_offset_recovered_from_known_clocks() -> None:
    clocks = FakeClocks(OFFSET)
    o = measure_offset(clocks.realtime_ns, clocks.run_ns)
    assert abs(o.offset_ns - OFFSET) <= o.width_ns // 2 + 1
    assert o.width_ns < 300  # the tightest of the sandwiches, not a typical one


def test_kernel_clock_maps_stamps_and_records_a_step() -> None:
    clocks = FakeClocks(OFFSET)
    clock = KernelClock(clocks.realtime_ns, clocks.run_ns)
    report = clock.start()
    stamp = OFFSET + 9_000_000_000  # the kernel's realtime stamp of data that arrived at run time 9 s
    assert abs(stamp - clock.offset_ns - 9_000_000_000) <= report.width_ns
    clocks.offset += 3_000_000  # the wall clock is stepped 3 ms forward during the run
    assert report.drift_ns is None
    drift = clock.check().drift_ns
    assert drift is not None and abs(drift - 3_000_000) <= 2 * report.width_ns


def test_each_read_keeps_the_offset_inside_its_sandwich() -> None:
    """A wall clock that gains on the run clock (stepped 1 µs per read, 40 ms in all) moves the offset
    with it, read by read, so a stamp 150 µs before its read maps there at the end as at the start,
    also when the thread was switched out between the read and the wall-clock read."""
    clocks = FakeClocks(OFFSET)
    clock = KernelClock(clocks.realtime_ns, clocks.run_ns)
    start = clock.start().offset_ns
    for _ in range(40_000):
        clocks.offset += 1_000
        t_read = clocks.run_ns()
        stamp = t_read - 150_000 + clocks.offset  # the kernel's realtime stamp of data 150 µs old
        assert abs(clock.stamp(stamp, t_read) - (t_read - 150_000)) < 1_000
    assert abs(clock.offset_ns - start - 40_000_000) < 1_000
    t_read = clocks.run_ns()
    clocks.t += 5_000_000  # a 5 ms thread switch between the read's return and the wall-clock read
    assert abs(clock.stamp(t_read - 150_000 + clocks.offset, t_read) - (t_read - 150_000)) < 1_000
    assert abs(clock.offset_ns - clocks.offset) < 1_000


def test_no_stamp_is_placed_after_its_read() -> None:
    clocks = FakeClocks(OFFSET)
    clock = KernelClock(clocks.realtime_ns, clocks.run_ns)
    clock.start()
    t_read = clocks.run_ns()
    # the wall clock was stepped 3 ms back between the data's arrival and its read: the stamp looks new
    assert clock.stamp(t_read + clocks.offset + 3_000_000, t_read) == t_read


def _stamp_of(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The CLOCK_REALTIME stamp (ns) in recvmsg ancillary data, or None when there is none."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return None


@contextlib.contextmanager
def _stamped_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A loopback TCP pair (sender, receiver) whose receiver already gets kernel stamps."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        with socket.create_connection(srv.getsockname()) as rx:
            tx, _ = srv.accept()
            with tx:
                assert enable_rx_timestamps(rx)
                # Linux turns receive stamping on through a deferred static key: on a busy box the
                # first packets after enabling it may carry none. Exchange until one does.
                deadline = time.monotonic() + 10
                while True:
                    tx.sendall(b"w")
                    _, anc, _, _ = rx.recvmsg(4096, ANCILLARY_SIZE)
                    if _stamp_of(anc) is not None:
                        break
                    assert time.monotonic() < deadline, "no receive stamp within 10 s"
                yield tx, rx


@needs_kernel_stamps
def test_loopback_stamp_lies_between_send_and_read() -> None:
    """A real TCP pair: the mapped kernel stamp is after the sender's send began and before the
    receiver's read returned, and the read returned later than the stamp when the reader was late."""
    clock = KernelClock()
    clock.start()
    with _stamped_pair() as (tx, rx):
        for _ in range(5):
            before = time.perf_counter_ns()
            tx.sendall(b"x" * 100)
            late = time.perf_counter_ns() + 2_000_000
            while time.perf_counter_ns() < late:  # the reader is busy for 2 ms
                pass
            data, anc, _, _ = rx.recvmsg(4096, ANCILLARY_SIZE)
            after = time.perf_counter_ns()
            raw = _stamp_of(anc)
            assert data == b"x" * 100 and raw is not None
            assert before <= clock.stamp(raw, after) <= after - 2_000_000
    assert clock.check().drift_ns is not None


def _step_wall_clock(ns: int) -> None:
    time.clock_settime_ns(time.CLOCK_REALTIME, time.clock_gettime_ns(time.CLOCK_REALTIME) + ns)


@needs_kernel_stamps
@needs_clock_setting
def test_a_real_wall_clock_step_moves_no_stamp() -> None:
    """The machine's wall clock stepped 20 ms forward mid-run (and back after): the next read's
    sandwich moves the offset by the step, so its stamp stays between its send and its read, where
    the offset taken at the start would put it 20 ms after the read; the clock report shows the step."""
    step = 20_000_000
    clock = KernelClock()
    clock.start()
    with _stamped_pair() as (tx, rx):
        _step_wall_clock(step)
        try:
            before = time.perf_counter_ns()
            tx.sendall(b"y" * 100)
            data, anc, _, _ = rx.recvmsg(4096, ANCILLARY_SIZE)
            after = time.perf_counter_ns()
            start_offset, mapped = clock.offset_ns, clock.stamp(_stamp_of(anc) or 0, after)
            drift = clock.check().drift_ns
        finally:
            _step_wall_clock(-step)
    raw = _stamp_of(anc)
    assert data == b"y" * 100 and raw is not None
    assert before <= mapped <= after
    assert raw - start_offset > after + step // 2
    assert abs(clock.offset_ns - start_offset - step) < 1_000_000
    assert drift is not None and abs(drift - step) < 1_000_000


@needs_clock_setting
def test_wall_clock_gain_makes_the_wall_clock_gain_while_its_command_runs_then_puts_it_back() -> None:
    """`benchmarks/wall_clock_gain.py` as a user runs it: the command inside sees its wall clock gain
    about the asked share on the monotonic clock (5 %: well above what a machine's own clock may do);
    after it, the wall clock is back at the offset it started from, to a millisecond."""
    root = Path(__file__).resolve().parents[2]
    probe = ("import time\nfrom itlbench.load.clients.kclock import measure_offset\n"
             "a = measure_offset(time.time_ns, time.monotonic_ns).offset_ns; time.sleep(1.0)\n"
             "print(measure_offset(time.time_ns, time.monotonic_ns).offset_ns - a)")
    proc = subprocess.run([sys.executable, "benchmarks/wall_clock_gain.py", "--gain", "5", "--",
                           sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=60)
    after = measure_offset(time.time_ns, time.monotonic_ns).offset_ns
    assert proc.returncode == 0, proc.stderr
    gained = int(proc.stdout.strip())
    assert 25_000_000 < gained < 60_000_000  # 5 % of 1 s, less what the stepper's sleeps lose
    base = int(proc.stderr.rsplit("=", 1)[1].split()[0])
    assert abs(after - base) < 1_000_000
