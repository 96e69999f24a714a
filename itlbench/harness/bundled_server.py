"""Start the bundled engine's server as a child process on a free loopback port, and stop it.

A separate process keeps the engine's compute off the load driver's CPU accounting and event loop,
the way a real deployment would be measured.

The child binds the port itself (port 0: the kernel picks one) once its engine is built, and says
which in a port file (`server.main.report_port`: JSON {port, pid}); only then is `/health` asked,
there. Picking a free port here, releasing it and having the child bind it minutes later left it to
anyone in between, and `/health` would have believed whatever answered: now the port is the child's
from the moment it is known, and the file's pid must be the child's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ItlbenchError
from itlbench.harness.http_json import request_json
from itlbench.system.malloc import env_with_malloc_tunables
from itlbench.system.parent import PARENT_PID_ENV

PORT_FILE_ENV = "ITLBENCH_PORT_FILE"  # where the child says its port (server.main.report_port reads it)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(cfg: EngineConfig, host: str, port: int, otlp_endpoint: str | None = None) -> list[str]:
    """`itlbench serve` with the whole EngineConfig as JSON: the child runs exactly what run.json records."""
    # -P: the working directory is not put on sys.path (a planted `itlbench/` there is not run)
    cmd = [sys.executable, "-P", "-m", "itlbench", "serve", "--engine-config", cfg.to_json(),
           "--host", host, "--port", str(port)]
    return cmd + ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else cmd


@dataclass
class BundledServer:
    """`with BundledServer(cfg, log_path) as srv:` → srv.base_url is a live OpenAI-style API."""

    engine: EngineConfig
    log_path: Path
    host: str = "127.0.0.1"
    start_timeout_s: float = 300.0
    port: int = 0  # 0: the child binds a free one and reports it
    process: subprocess.Popen[bytes] | None = None
    port_file: Path = Path()
    engine_info: dict[str, object] = field(default_factory=dict)
    otlp_endpoint: str | None = None  # the server exports its spans and GenAI metrics here

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self) -> BundledServer:
        cmd = server_command(self.engine, self.host, self.port, self.otlp_endpoint)
        env = env_with_malloc_tunables()
        env[PARENT_PID_ENV] = str(os.getpid())  # the server exits when this process dies
        # the key set for other commands (docker compose's engine, --endpoint) is not this loopback child's: inherited,
        # it made the child require a key that the harness's own requests do not send (a 401 traceback)
        env.pop("ITLBENCH_API_KEY", None)
        self.port_file = self.log_path.parent / f".server-port-{os.getpid()}-{id(self)}.json"
        self.port_file.unlink(missing_ok=True)
        env[PORT_FILE_ENV] = str(self.port_file)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        log.close()
        self._wait_healthy()
        self.engine_info = request_json(f"{self.base_url}/engine", timeout=2.0)
        return self

    def _reported_port(self) -> int | None:
        """The port our child says it bound (None until it has); a file from another pid is refused."""
        try:
            doc = json.loads(self.port_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or self.process is None or doc.get("pid") != self.process.pid:
            raise ItlbenchError(f"{self.port_file} was not written by the bundled engine server "
                                f"(pid {self.process.pid if self.process else '?'}): {doc!r}")
        port = doc.get("port")
        return port if isinstance(port, int) and 0 < port < 65536 else None

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ItlbenchError(f"the bundled engine server exited with code {self.process.returncode}; "
                                    f"its log:\n{self.tail_log()}")
            reported = self._reported_port()
            if reported is None or (self.port and reported != self.port):
                time.sleep(0.1)
                continue
            self.port = reported
            self.port_file.unlink(missing_ok=True)
            try:
                request_json(f"{self.root_url}/health", timeout=1.0)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError, OSError):
                time.sleep(0.2)
        self.stop()
        raise ItlbenchError(f"the bundled engine server did not become healthy within {self.start_timeout_s:.0f} s; "
                            f"its log:\n{self.tail_log()}")

    def tail_log(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout_s`); the server's exit status, None when there was none to stop."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.terminate()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def __enter__(self) -> BundledServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
