"""Who may take part in a Locust run, and what a job may ask a worker to run.

Locust's message channel (ZeroMQ) has no authentication: anyone who reaches the master's port can
connect as a worker, and a worker will talk to whatever listens where `--master` points. So:

- every run has a fresh token (`new_token`), handed to the master and to local workers in their
  environment and printed with the command that starts a worker by hand (`TOKEN_ENV=... itlbench
  locust-worker ...`). The token itself never crosses the wire: a worker says hello with a nonce, the
  master answers with its own nonce and a MAC proving it knows the token, the worker answers with a
  MAC over the master's nonce. Only workers that pass get a share of the run (and users);
- the job a master sends carries a MAC over its bytes and the worker's nonce, so a worker runs only
  a job from its own master, never a replayed or substituted one;
- a job names its plan factory by `module:function`; workers call only those in `ALLOWED_FACTORIES`
  (a name outside it is refused before anything is imported);
- the bearer key for the target is never part of a job: each worker reads it from its own
  environment (`worker_api_key`).

This module imports no locust (see `job.py`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from itlbench.errors import ConfigError

TOKEN_ENV = "ITLBENCH_LOCUST_TOKEN"  # the run's token, in the master's and every worker's environment
WORKER_KEY_ENV = "ITLBENCH_LOCUST_API_KEY"  # the bearer key a local worker gets from the launcher
USER_KEY_ENV = "ITLBENCH_API_KEY"  # ... or, on a worker started by hand, the user's own
ALLOWED_FACTORIES = frozenset({
    "itlbench.load.locust.job:plan_from_spec",  # every `itlbench run --driver locust`
    "itlbench.testing.plans:fixed_streams",  # client-measurement plans (benchmarks, tests)
})

# Worker -> master, then master -> worker, then worker -> master (see the module docstring):
MSG_HELLO = "itlbench_hello"  # {nonce}
MSG_CHALLENGE = "itlbench_challenge"  # {nonce, mac}: the master's nonce, and its proof over the worker's
MSG_PROOF = "itlbench_proof"  # {mac}: the worker's proof over the master's nonce


def new_token() -> str:
    """A fresh per-run token (192 random bits)."""
    return secrets.token_urlsafe(24)


def new_nonce() -> str:
    return secrets.token_hex(16)


def mac(token: str, *parts: str) -> str:
    """HMAC-SHA256 of the parts (each tagged by its role, so one proof cannot stand for another)."""
    return hmac.new(token.encode(), "\x1f".join(parts).encode(), hashlib.sha256).hexdigest()


def verify(token: str, given: object, *parts: str) -> bool:
    """Constant-time check of a MAC received from the other side (anything but a str fails)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), mac(token, *parts).encode())


def master_proof(token: str, worker_nonce: str, client_id: str) -> str:
    return mac(token, "master", worker_nonce, client_id)


def worker_proof(token: str, master_nonce: str, client_id: str) -> str:
    return mac(token, "worker", master_nonce, client_id)


def job_mac(token: str, worker_nonce: str, client_id: str, k: int, n: int, payload: str) -> str:
    return mac(token, "job", worker_nonce, client_id, str(k), str(n), payload)


def token_from_env(flag: str = TOKEN_ENV) -> str:
    """The run's token, or a one-line error saying where it comes from."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(flag, f"{TOKEN_ENV} is not set",
                          "start the worker with the exact command `itlbench run --driver locust` prints")
    return token


def check_factory(name: str) -> None:
    """Refuse a plan factory outside the allow-list (a job from the wire may name anything)."""
    if name not in ALLOWED_FACTORIES:
        raise ConfigError("plan_factory", f"{name!r} is not an allowed plan factory",
                          f"use one of {', '.join(sorted(ALLOWED_FACTORIES))}")


def worker_api_key() -> str | None:
    """The bearer key this worker sends: from its own environment, never from the master."""
    return os.environ.get(WORKER_KEY_ENV) or os.environ.get(USER_KEY_ENV) or None
