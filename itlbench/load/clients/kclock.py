"""Kernel receive timestamps on a TCP socket, mapped onto the run's clock.

With `SO_TIMESTAMPNS` set, the kernel stamps every received packet when it reaches the network stack
(on loopback: inside the sender's `send`, in `netif_rx`) and `recvmsg` hands back the stamp of the
newest packet it read as ancillary data. The stamp does not move when the client is slow to read,
so a busy client cannot delay it. `SO_TIMESTAMPING` with software receive stamps reads the same
`skb` time and works here too; `SO_TIMESTAMPNS` is used because its ancillary data is one timespec
(16 bytes) and it switches stamp generation on by itself (`SO_TIMESTAMPING` needs a generation and a
reporting flag). When TCP merges a newer segment into one already queued, the merged data carries the
newer stamp, so a stamp is always that of the last bytes the read returned.

The kernel stamps with CLOCK_REALTIME; the run's clock is `perf_counter_ns` (CLOCK_MONOTONIC). The
offset between them is measured at the start as the tightest of many run/realtime/run sandwiches, and
every read checks it again: the wall clock is read between the read's return and one more run-clock
read, and the offset is moved, by as little as possible, into the range that sandwich allows
(`KernelClock.stamp`). Where the thread was switched out inside a sandwich, that side of it allows
much and constrains nothing; a narrow side holds the offset to within its width.

One offset for the whole run is not enough: on one CI machine (a VM) the wall clock gained about 0.6 % on CLOCK_MONOTONIC, and stamps
mapped through the start offset fell up to 0.5 ms after their own reads within 0.1 s. Mapping each
stamp by its age alone (the wall clock at the read less the stamp) is not enough either: a thread
switch between the two clock reads makes a stamp early by the switch. What remains is a step of the
wall clock between a stamp and its read, which moves that stamp by the step; no stamp is placed after
its read. `check()` at the end records how far the wall clock moved over the run.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

# asm-generic values (x86, arm, arm64, riscv, powerpc, s390); Python's socket module does not export
# them. Architectures with their own numbering (alpha, mips, parisc, sparc) are not tried.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_GENERIC_MACHINES = ("x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l", "armv8l", "riscv64",
                     "ppc64le", "ppc64", "s390x")
TIMESPEC = struct.Struct("@ll")  # struct __kernel_old_timespec: the layout SO_TIMESTAMPNS (old) returns
ANCILLARY_SIZE = socket.CMSG_SPACE(TIMESPEC.size)


def platform_supported() -> bool:
    """Linux with the generic socket option numbering."""
    return sys.platform.startswith("linux") and platform.machine().lower() in _GENERIC_MACHINES


def enable_rx_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp this socket's received data; False where it refuses."""
    if not platform_supported():
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS) == 1


def kernel_stamps_available() -> str | None:
    """None when this host gives kernel receive stamps on TCP sockets, else why not."""
    if not platform_supported():
        return f"kernel receive timestamps need Linux on a common architecture, not {sys.platform}/{platform.machine()}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if not enable_rx_timestamps(s):
            return "the kernel refused SO_TIMESTAMPNS on a TCP socket"
    return None


@dataclass(frozen=True)
class ClockOffset:
    """CLOCK_REALTIME − run clock, from the tightest sandwich; `width_ns` bounds its error."""

    offset_ns: int
    width_ns: int


def measure_offset(realtime_ns: Callable[[], int] = time.time_ns,
                   run_ns: Callable[[], int] = time.perf_counter_ns, samples: int = 64) -> ClockOffset:
    """Read run/realtime/run `samples` times; the narrowest sandwich gives the offset at its middle."""
    best: ClockOffset | None = None
    for _ in range(samples):
        a = run_ns()
        r = realtime_ns()
        b = run_ns()
        if best is None or b - a < best.width_ns:
            best = ClockOffset(r - (a + b) // 2, b - a)
    assert best is not None
    return best


@dataclass
class ClockReport:
    """What a run records about its kernel stamps' clock mapping."""

    offset_ns: int
    width_ns: int
    drift_ns: int | None = None  # offset at the end − offset at the start; None until checked

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


class KernelClock:
    """Maps kernel (CLOCK_REALTIME) stamps to the run's clock through an offset measured at `start()`
    and kept, read by read, inside what each read's sandwich allows."""

    def __init__(self, realtime_ns: Callable[[], int] = time.time_ns,
                 run_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._realtime_ns, self._run_ns = realtime_ns, run_ns
        self.report = ClockReport(0, 0)
        self.offset_ns = 0

    def start(self) -> ClockReport:
        o = measure_offset(self._realtime_ns, self._run_ns)
        self.offset_ns = o.offset_ns
        self.report = ClockReport(o.offset_ns, o.width_ns)
        return self.report

    def stamp(self, stamp_ns: int, t_read_ns: int) -> int:
        """`stamp_ns` on the run's clock, for data whose read returned at `t_read_ns` (just read)."""
        wall = self._realtime_ns()
        after = self._run_ns()
        o = self.offset_ns
        if o < wall - after:  # the wall clock gained on the run's clock: the least move that fits
            o = self.offset_ns = wall - after
        elif o > wall - t_read_ns:
            o = self.offset_ns = wall - t_read_ns
        t = stamp_ns - o
        return t if t < t_read_ns else t_read_ns

    def check(self) -> ClockReport:
        """Measure again and record how far the offset moved since `start()` (a wall-clock step)."""
        o = measure_offset(self._realtime_ns, self._run_ns)
        self.report.drift_ns = o.offset_ns - self.report.offset_ns
        return self.report
