"""What `itlbench sweep` and `capacity` do with the run options they pass on: the flags they own, the seed of each
repeat, where their directory goes by default, and how a run or a signal ended."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from itlbench.errors import ConfigError
from itlbench.report.data import read_json

OWNED_FLAGS = ("--chunk-budget", "--policy", "--out", "--max-num-seqs")
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130  # `itlbench run`'s statuses for refused options and Ctrl-C


def check_run_args(args: Sequence[str], served: bool) -> None:
    for flag in (*OWNED_FLAGS, "--endpoint"):
        if any(a == flag or a.startswith(flag + "=") for a in args):
            if flag == "--endpoint":
                raise ConfigError("--endpoint", "a sweep restarts the engine for every point",
                                  "give the server's start command as --serve 'CMD --port {port} …', or measure "
                                  "a running server with `itlbench run --endpoint` and `itlbench compare`")
            raise ConfigError(flag, "is set by the sweep itself", "give it to `itlbench sweep`, not as a run option")
    if served and _flag_value(args, "--engine") is not None:
        raise ConfigError("--engine", "is the served command's business with --serve", "put it in the template")


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def bundled_target(args: Sequence[str]) -> str:
    """The bundled engine as a study's report names it: `--engine sim` is the simulator on its GPU, not the model."""
    if _flag_value(args, "--engine") != "sim":
        return "the bundled engine"
    gpu = _flag_value(args, "--gpu")
    return f"the simulated engine ({gpu})" if gpu else "the simulated engine"


def repeat_seed(args: Sequence[str], served: bool) -> int | None:
    """The first repeat's seed where repeats must vary it (the bundled simulator: it has no noise of its own,
    so repeats of one seed are one run), else None (repeats keep the seed; the machine gives the spread)."""
    if served or _flag_value(args, "--engine") != "sim":
        return None
    text = _flag_value(args, "--seed")
    try:
        return 0 if text is None else int(text)
    except ValueError:
        raise ConfigError("--seed", f"cannot read {text!r} as a whole number", "e.g. --seed 7") from None


def with_seed(args: Sequence[str], seed: int) -> list[str]:
    """`args` with `--seed` set to `seed` (the user's own --seed taken out, not given twice)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--seed":
            skip = True
        elif not a.startswith("--seed="):
            out.append(a)
    return [*out, "--seed", str(seed)]



def default_sweep_dir(args: Sequence[str], reports_dir: Path = Path("reports"), kind: str = "sweep") -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    parts = [stamp, kind, _flag_value(args, "--workload") or "chat"]
    inject = _flag_value(args, "--inject")
    if inject:
        parts.append("inj" + re.sub(r"[^0-9a-zA-Z]+", "_", inject))
    return reports_dir / "-".join(parts)



def stopped_early(run_dir: Path) -> bool:
    doc = read_json(run_dir / "run.json") or {}
    return bool(doc.get("interrupted")) or doc.get("stop_reason") in ("stop_event", "interrupted")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[Callable[[], None]]:
    """SIGTERM raises KeyboardInterrupt (so `finally` stops the point's server) until the block ends; the
    yielded function re-arms it after a run, whose event loop resets SIGTERM to the default on leaving."""
    previous = signal.getsignal(signal.SIGTERM)

    def arm() -> None:
        with contextlib.suppress(ValueError):  # not the main thread: nothing to arm
            signal.signal(signal.SIGTERM, _raise_interrupt)

    arm()
    try:
        yield arm
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)


def remove_if_empty(path: Path) -> None:
    """Bad input found by the first run: the empty directories made for it go (any file stays)."""
    for sub in sorted(path.rglob("*"), reverse=True) if path.exists() else []:
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if path.exists() and not any(path.iterdir()):
        path.rmdir()
