"""Who takes part in a Locust run: the per-run token, the plan-factory allow-list, the bearer key kept
off the wire. Master and workers run as real processes (Locust is never imported here)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.harness.locust_run import drive_locust
from itlbench.load.locust import auth
from itlbench.load.locust.job import LocustJob
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, spawn

FIXED = "itlbench.testing.plans:fixed_streams"


def test_a_job_naming_a_factory_outside_the_allow_list_is_refused_before_any_import():
    doc = json.loads(LocustJob.for_plan(Target("http://127.0.0.1:9/v1", "m"), "/tmp/x", duration_s=1.0,
                                        factory=FIXED).to_json())
    doc.update(plan_factory="this:x", plan_kwargs={"args": ["touch", "/tmp/pwned"]})
    sys.modules.pop("this", None)
    with pytest.raises(ConfigError, match="plan_factory: 'this:x' is not an allowed plan factory"):
        LocustJob.from_json(json.dumps(doc))
    job = LocustJob.for_plan(Target("http://127.0.0.1:9/v1", "m"), "/tmp/x", duration_s=1.0, factory=FIXED)
    job.plan_factory = "subprocess:run"  # as a tampered message would carry it
    with pytest.raises(ConfigError, match="not an allowed plan factory"):
        job.build_plan()
    assert "this" not in sys.modules


def test_proofs_bind_the_token_the_nonces_and_the_worker():
    t = auth.new_token()
    p = auth.master_proof(t, "n1", "w1")
    assert auth.verify(t, p, "master", "n1", "w1")
    assert not auth.verify(auth.new_token(), p, "master", "n1", "w1")  # another run's token
    assert not auth.verify(t, p, "master", "n2", "w1") and not auth.verify(t, p, "master", "n1", "w2")
    assert not auth.verify(t, p, "worker", "n1", "w1")  # a master proof is not a worker proof
    assert not auth.verify(t, 123, "master", "n1", "w1") and not auth.verify(t, None, "master", "n1", "w1")
    job = auth.job_mac(t, "n1", "w1", 0, 2, '{"a": 1}')
    assert not auth.verify(t, job, "job", "n1", "w1", "0", "2", '{"a": 2}')  # a changed job


def test_a_worker_without_a_token_says_so_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
    p = subprocess.run([sys.executable, "-m", "itlbench.load.locust.worker", "--master", "127.0.0.1:9"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: ITLBENCH_LOCUST_TOKEN: ITLBENCH_LOCUST_TOKEN is not set (start the worker with the exact "
        "command `itlbench run --driver locust` prints)"]


@pytest.mark.e2e
def test_a_worker_with_another_runs_token_gets_no_job_and_takes_none(tmp_path: Path):
    """Both directions: the master gives the stranger nothing, the stranger does not trust the master."""
    proc, url = spawn(PacedConfig(tick_s=0.01))
    statuses: list[str] = []
    strangers: list[subprocess.Popen[str]] = []
    job = LocustJob.for_plan(Target(url, "paced", timeout_s=30.0), tmp_path, duration_s=2.0, factory=FIXED,
                             plan_kwargs={"streams": 1, "tokens": 3}, workers=1, master_bind="127.0.0.1:0",
                             worker_wait_s=8.0)

    async def main() -> None:
        async def stranger() -> None:
            while not any("locust-worker" in s for s in statuses):
                await asyncio.sleep(0.05)
            command = next(s for s in statuses if "locust-worker" in s).split("`")[1].split()
            env = {**os.environ, auth.TOKEN_ENV: auth.new_token()}
            strangers.append(subprocess.Popen([sys.executable, "-m", "itlbench", *command[2:]], env=env, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        side = asyncio.create_task(stranger())
        try:
            await drive_locust(job, RunStore(tmp_path), on_status=statuses.append)
        finally:
            side.cancel()

    try:
        with pytest.raises(ItlbenchError, match=r"0 of 1 workers connected within 8 s \(1 connected without "
                                                r"this run's token: ignored\)"):
            asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()
        for p in strangers:
            p.kill()
    out = strangers[0].communicate(timeout=30)[0]
    assert "does not hold this run's token" in out and "cannot take the job" not in out
    assert not list(tmp_path.glob("workers/*/requests/*.parquet")) and not (tmp_path / "requests").exists()


@pytest.mark.e2e
def test_the_bearer_key_reaches_local_workers_from_their_environment_never_the_master(tmp_path: Path):
    key = "sk-" + auth.new_token()
    proc, url = spawn(PacedConfig(tick_s=0.01, api_key=key))
    job = LocustJob.for_plan(Target(url, "paced", timeout_s=30.0, api_key=key), tmp_path, duration_s=2.0,
                             factory=FIXED, plan_kwargs={"streams": 2, "tokens": 5}, workers=1)
    envs: dict[str, dict[str, str]] = {}

    async def main() -> None:
        async def look() -> None:
            deadline = time.monotonic() + 60
            while len(envs) < 2 and time.monotonic() < deadline:
                for c in psutil.Process().children(recursive=True):
                    for role in ("master", "worker"):
                        if any(f"itlbench.load.locust.{role}" in a for a in c.cmdline()):
                            envs[role] = c.environ()
                await asyncio.sleep(0.05)
        side = asyncio.create_task(look())
        await drive_locust(job, RunStore(tmp_path))
        await side

    try:
        asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()
    req = read_table(tmp_path, "requests")
    assert req.height >= 2 and (req["status"] == "ok").all(), req.filter(pl.col("status") != "ok")
    assert not any(key in v for v in envs["master"].values()), "the master holds no key, so it cannot send one"
    assert envs["worker"][auth.WORKER_KEY_ENV] == key and auth.TOKEN_ENV in envs["master"]
    assert key not in (tmp_path / "locust_job.json").read_text()
