"""The dashboards, provisioning and compose files hold together without a running stack: the committed
JSON is what the generator writes, every expression is valid PromQL (promtool), every variable used is
defined, Prometheus' config passes promtool, and docker-compose accepts the compose file whose
mounted files all exist. (What the queries return against a real scrape: test_telemetry_live.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from itlbench.telemetry.dashboards import PREFIXES, generate, main
from tests.support.dashboards import BUILTIN_VARIABLES, ROOT, VAR_RE, dashboards, substitute, targets


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    for name, text in generate().items():
        assert (ROOT / "dashboards" / name).read_text() == text, \
            f"dashboards/{name} is stale: run `python -m itlbench.telemetry.dashboards`"


def test_the_generator_writes_where_it_runs_and_checks_staleness(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--check"]) == 1  # nothing written here yet
    assert main([]) == 0
    assert sorted(p.name for p in (tmp_path / "dashboards").iterdir()) == sorted(generate())
    capsys.readouterr()
    assert main(["--check"]) == 0
    assert capsys.readouterr().out.startswith("up to date: dashboards/")  # a passing check says so


def test_structure_uids_ids_targets_units() -> None:
    boards = dashboards()
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    for name, board in boards.items():
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        data_panels = [p for p in board["panels"] if p["type"] != "row"]
        assert len(data_panels) >= 10
        for p in data_panels:
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
            assert p["fieldConfig"]["defaults"].get("unit"), f"{name}: {p['title']} has no unit"
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert all(refs) and len(set(refs)) == len(refs), p["title"]
            for t in p["targets"]:
                assert t["expr"].strip(), p["title"]
                assert " or " not in t["expr"], "an `or` would hide a metric nobody exports"
                if "rate(" in t["expr"] or "increase(" in t["expr"] or "_over_time(" in t["expr"]:
                    # a table's instant query may look over the whole range instead
                    assert "[$__rate_interval]" in t["expr"] or (t["instant"] and "[$__range]" in t["expr"]), t["expr"]
        grid = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]]
        assert len(set(grid)) == len(grid), f"{name}: panels overlap"


def test_every_variable_used_is_defined() -> None:
    for name, board in dashboards().items():
        defined = {v["name"] for v in board["templating"]["list"]}
        assert "DS_PROMETHEUS" in defined
        text = json.dumps(board)
        used = {next(g for g in m.groups() if g) for m in VAR_RE.finditer(text)}
        missing = used - defined - BUILTIN_VARIABLES
        assert not missing, f"{name} uses undefined variables {missing}"
        ds = next(v for v in board["templating"]["list"] if v["name"] == "DS_PROMETHEUS")
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"


def need(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} is missing: apt-get install -y --no-install-recommends prometheus docker-compose (.ci/run does)"
    return path


def test_every_expression_passes_promtool(tmp_path: Path) -> None:
    """Each query, with each engine prefix, wrapped as a recording rule."""
    rules = []
    for name, board in dashboards().items():
        for i, (where, t) in enumerate(targets(board)):
            for prefix in PREFIXES:
                record = f"itlbench_check:{board['uid'].replace('-', '_')}:{i}:{re.sub(r'[^a-z]', '', prefix)}"
                rules.append({"record": record, "expr": substitute(t["expr"], prefix),
                              "labels": {"where": f"{name} {where}"[:200]}})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    r = subprocess.run([need("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(rules)} rules found" in r.stdout


def test_compose_prometheus_config_passes_promtool() -> None:
    r = subprocess.run([need("promtool"), "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _compose_config(env: dict[str, str] | None = None) -> dict[str, Any]:
    run_env = {**os.environ, **(env or {})}
    r = subprocess.run([need("docker-compose"), "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT, env=run_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config"], cwd=ROOT, env=run_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def test_compose_file_is_valid_and_every_mounted_file_exists() -> None:
    for env in ({}, {"COMPOSE_PROFILES": "gpu", "ENGINE": "engine-gpu"}):
        config = _compose_config(env)
        services = config["services"]
        for service in ("harness", "prometheus", "grafana", "otel-collector"):
            assert service in services
        assert services["harness"]["network_mode"] == f"service:{env.get('ENGINE', 'engine')}"
        for name, svc in services.items():
            for vol in svc.get("volumes", []):
                source = vol["source"] if isinstance(vol, dict) else vol.split(":")[0]
                kind = vol.get("type") if isinstance(vol, dict) else ("bind" if source.startswith((".", "/")) else "volume")
                if kind == "bind":
                    assert Path(source).exists(), f"{name} mounts {source}, which does not exist"
            build = svc.get("build")
            if build:
                assert (Path(build["context"]) / build.get("dockerfile", "Dockerfile")).is_file()
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["engine-gpu"]["runtime"] == "nvidia"
    assert compose["services"]["engine"]["profiles"] == ["cpu"] and compose["services"]["engine-gpu"]["profiles"] == ["gpu"]


def test_provisioning_matches_prometheus_and_the_dashboard_mount() -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/itlbench.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    grafana = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"]
    assert f"./dashboards:{path}:ro" in grafana["volumes"]
    jobs = {j["job_name"] for j in prom["scrape_configs"]}
    assert {"itlbench-engine", "itlbench-client", "otel-collector"} <= jobs


def test_a_rate_of_seconds_is_not_shown_in_seconds() -> None:
    """rate() of a seconds counter is seconds per second, a pure number: in Grafana's unit `s` an engine
    busy 81 % of the time would read "810 ms"."""
    checked = 0
    for name, board in dashboards().items():
        for p in board["panels"]:
            for t in p.get("targets", []):
                if re.search(r"rate\([^()]*_seconds_(sum|total)\b", t["expr"]) and "/" not in t["expr"]:
                    checked += 1
                    assert p["fieldConfig"]["defaults"]["unit"] != "s", f"{name}: {p['title']} ({t['expr']})"
    assert checked >= 2  # the prefill:decode split and the stalled seconds


def test_check_tells_missing_files_from_stale_ones(tmp_path, capsys) -> None:
    """Run outside the repository, --check said 'out of date' for files that were not there at all."""
    assert main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("missing (") and "out of date" not in err
    assert main(["--out", str(tmp_path)]) == 0 and main(["--check", "--out", str(tmp_path)]) == 0
    first = sorted(tmp_path.iterdir())[0]
    first.write_text(first.read_text() + " ")
    capsys.readouterr()
    assert main(["--check", "--out", str(tmp_path)]) == 1
    stale = capsys.readouterr().err
    assert stale.startswith("out of date (") and stale.rstrip().endswith(str(first))
