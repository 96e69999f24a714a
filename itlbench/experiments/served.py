"""One server per sweep point from the user's command template (`--serve 'vllm serve … --port {port}'`).

The engines people run take their chunk budget as a start-up flag, so a sweep over it must restart
the server. itlbench fills the template (`{port}`: a free loopback port; every swept setting by its
name; `{otlp_endpoint}`: with --receive-otlp, the traces URL of itlbench's span receiver), starts it in its own session (its own process group), waits until `/health` or `/v1/models`
answers, and afterwards stops the whole group: SIGTERM, then SIGKILL after a grace period. Its
output goes to a log file that the sweep keeps beside the run. The child also asks Linux to SIGTERM it
if itlbench dies (and `itlbench serve` dies with its parent by ITLBENCH_PARENT_PID), so not even a
SIGKILLed sweep leaves the server behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import string
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.system.parent import PARENT_PID_ENV, die_with_parent

_SHELL = re.compile(r"[|&;<>()$`\\\n*?]")


class ServerFailed(ItlbenchError):
    """The point's server exited, or never answered its health check; `log_tail` says why."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message + (f"\n--- server.log (last lines) ---\n{log_tail}" if log_tail else ""))
        self.reason = message
        self.log_tail = log_tail


def template_fields(template: str) -> set[str]:
    """The `{name}` placeholders of a template (refuses one that does not parse, naming --serve)."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ConfigError("--serve", f"the template does not parse ({exc})",
                          "write placeholders as {port}, {chunk_budget}; double a literal brace: {{") from None


OTLP_FIELD = "otlp_endpoint"  # filled with the traces URL of the command's --receive-otlp receiver


def check_template(template: str, swept: list[str], otlp: bool = False) -> None:
    """{port} must be there (itlbench chooses it) and every swept setting too (else the sweep changes nothing);
    {otlp_endpoint} only where the command receives spans (`otlp`)."""
    names = template_fields(template)
    if OTLP_FIELD in names and not otlp:
        raise ConfigError("--serve", "the template has {otlp_endpoint} but nothing receives spans",
                          "add --receive-otlp auto (itlbench then fills in its receiver's traces URL)")
    names.discard(OTLP_FIELD)
    if "port" not in names:
        raise ConfigError("--serve", "the template has no {port}", "add e.g. --port {port}: itlbench picks a free one")
    missing = [n for n in swept if n not in names]
    if missing:
        raise ConfigError("--serve", "the template has no " + ", ".join("{" + n + "}" for n in missing),
                          "put every swept setting into the command, e.g. --max-num-batched-tokens {chunk_budget}")
    unknown = sorted(names - set(swept) - {"port", "model"})
    flagged = [n for n in unknown if n in ("chunk_budget", "policy", "max_num_seqs")]
    if flagged:
        flag = "--" + flagged[0].replace("_", "-")
        raise ConfigError("--serve", "the template has {" + flagged[0] + "} but nothing sweeps it",
                          f"give {flag} v1,v2 (or write the value into the command)")
    if unknown:
        raise ConfigError("--serve", "unknown placeholder " + ", ".join("{" + n + "}" for n in unknown),
                          "sweep it with --set NAME=v1,v2, or write the value into the command")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def substitute(template: str, values: dict[str, str]) -> str:
    return template.format(**values)


def _argv(command: str) -> list[str]:
    """The command itself where it is one (so signals reach the server, not a shell), else `sh -c`."""
    return ["/bin/sh", "-c", command] if _SHELL.search(command) else shlex.split(command)


def _child_setup(parent: int) -> None:  # runs in the child between fork and exec
    die_with_parent(parent)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback URL we built
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class ServedServer:
    """A context manager: the running server for one point. `command` is the filled-in template."""

    command: str
    port: int
    log_path: Path
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 15.0
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        with self.log_path.open("ab") as log:
            log.write(f"$ {self.command}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(_argv(self.command), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                             preexec_fn=lambda: _child_setup(int(env[PARENT_PID_ENV])))  # noqa: PLW1509
            except OSError as exc:
                raise ServerFailed(f"could not start the server command ({exc})", tail(self.log_path)) from None
        self.wait_healthy()

    def wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        root = f"http://127.0.0.1:{self.port}"
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerFailed(f"the server exited with code {code} before it became healthy",
                                   tail(self.log_path))
            if _answers(root + "/health") or _answers(root + "/v1/models"):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerFailed(f"the server did not answer /health or /v1/models within "
                                   f"{self.startup_timeout_s:g} s (raise --serve-timeout for a slow start)",
                                   tail(self.log_path))
            time.sleep(0.05)  # a loopback connect that is refused costs nothing: ask often

    def died(self) -> int | None:
        """The exit code if the server ended by itself (while a run used it), else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL what is left after the grace period; idempotent."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group is the child's pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)
            if self.proc.poll() is not None and not _group_alive(pgid):
                break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def __enter__(self) -> ServedServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
