"""A reader that closes the pipe early (`itlbench run ... 2>&1 | head`) cannot end a command before its files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from itlbench.cli.streams import PipeSafe

ROOT = Path(__file__).resolve().parents[2]


def test_writes_after_the_reader_left_are_dropped_not_raised() -> None:
    read_fd, write_fd = os.pipe()
    stream = PipeSafe(open(write_fd, "w", buffering=1))  # line-buffered: each line reaches the pipe
    stream.write("read\n")
    assert os.read(read_fd, 10) == b"read\n"
    os.close(read_fd)
    assert stream.write("lost\n") == 5 and stream.closed_by_reader
    stream.write("more\n")
    stream.flush()
    assert stream.isatty() is False  # the rest is the stream's own


def test_other_write_errors_still_raise(tmp_path: Path) -> None:
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    stream = PipeSafe(Full())
    try:
        stream.write("x")
    except OSError as exc:
        assert exc.errno == 28
    else:
        raise AssertionError("a full disk is not a reader that left")


def test_a_run_piped_into_head_still_writes_its_report(tmp_path: Path) -> None:
    """Before: the first write after `head` exited raised BrokenPipeError; the run had its records and
    summary.json but no report, and exited 1."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    proc = subprocess.Popen([sys.executable, "-m", "itlbench", "run", "--engine", "sim", "--model", "llama-3.1-8b",
                             "--gpu", "h100", "--workload", "chat-short", "--duration", "5", "--streams", "4",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=tmp_path)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # like `| head -1`: one line, then the reader is gone
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0, first
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()
