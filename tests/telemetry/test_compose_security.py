"""The compose stack is closed by default: every published port on 127.0.0.1 (BIND_HOST opens it),
no anonymous Grafana admin, the engine's key (when given) shared by the engine and the harness."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _config(env: dict[str, str]) -> dict[str, Any]:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is missing: apt-get install -y --no-install-recommends docker-compose")
    run_env = {k: v for k, v in os.environ.items() if k not in ("BIND_HOST", "ITLBENCH_API_KEY")} | env
    q = subprocess.run([tool, "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT, env=run_env,
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stdout + q.stderr
    r = subprocess.run([tool, "-f", "docker-compose.yml", "config"], cwd=ROOT, env=run_env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def _published(config: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, svc in config["services"].items():
        for p in svc.get("ports", []):
            out.setdefault(name, []).append(p if isinstance(p, str) else f"{p.get('host_ip')}:{p['published']}")
    return out


@pytest.mark.parametrize("profile", [{}, {"COMPOSE_PROFILES": "gpu", "ENGINE": "engine-gpu"}])
def test_every_port_is_on_loopback_by_default_and_bind_host_opens_it(profile: dict[str, str]):
    closed = _published(_config(profile))
    ports = [p for ps in closed.values() for p in ps]
    assert len(ports) >= 7 and all(p.startswith("127.0.0.1:") for p in ports), closed
    opened = [p for ps in _published(_config({**profile, "BIND_HOST": "0.0.0.0"})).values() for p in ps]
    assert all(p.startswith("0.0.0.0:") for p in opened) and len(opened) == len(ports)


def test_no_anonymous_grafana_admin_and_the_key_reaches_engine_and_harness():
    config = _config({"ITLBENCH_API_KEY": "sk-test"})
    grafana = config["services"]["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer" and grafana["GF_AUTH_DISABLE_LOGIN_FORM"] == "false"
    assert config["services"]["engine"]["environment"]["ITLBENCH_API_KEY"] == "sk-test"
    assert config["services"]["harness"]["environment"]["ITLBENCH_API_KEY"] == "sk-test"
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "Admin" not in str(raw["services"]["grafana"]["environment"].get("GF_AUTH_ANONYMOUS_ORG_ROLE"))
