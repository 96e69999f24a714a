"""What a Locust job tells its master and workers about the plan: the stream count the launcher counted (the
master then builds no plan, and so reads no trace), and a replayed trace only as a worker's own parsed copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from itlbench.errors import ConfigError
from itlbench.load.locust.job import LocustJob, plan_from_spec, spec_kwargs
from itlbench.load.target import Target
from itlbench.workloads.build import LoadSpec, read_trace

TARGET = Target("http://127.0.0.1:9/v1", "m")


def _trace(path: Path, rows: int = 12) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{10 + i * 0.05:09.6f},{20 + i},{4 + i % 3}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_launcher_s_stream_count_crosses_in_the_job_and_stands_for_building_the_plan(tmp_path: Path) -> None:
    spec = LoadSpec(workload="trace", trace_path=str(_trace(tmp_path / "t.csv")), duration_s=5, max_model_len=4096,
                    streams=3)
    job = LocustJob.for_plan(TARGET, tmp_path, duration_s=5.0, plan_kwargs=spec_kwargs(spec), streams=3)
    (tmp_path / "t.csv").unlink()  # building the plan would need the file
    assert LocustJob.from_json(job.to_json()).closed_streams() == 3
    counted = LocustJob.for_plan(TARGET, tmp_path, duration_s=5.0, factory="itlbench.testing.plans:fixed_streams",
                                 plan_kwargs={"streams": 2, "tokens": 4})
    assert counted.streams is None and counted.closed_streams() == 2  # no count given: the plan's own


@pytest.mark.parametrize("streams", [-1, "3", 2.5, True])
def test_a_stream_count_that_is_no_count_is_refused_naming_the_field(tmp_path: Path, streams: object) -> None:
    doc = json.loads(LocustJob.for_plan(TARGET, tmp_path, duration_s=1.0).to_json())
    doc["streams"] = streams
    with pytest.raises(ConfigError, match="streams: must be a count of streams"):
        LocustJob.from_json(json.dumps(doc))


def test_a_worker_s_handed_trace_builds_the_plan_and_a_trace_in_the_job_s_arguments_is_refused(tmp_path: Path) -> None:
    spec = LoadSpec(workload="trace", trace_path=str(_trace(tmp_path / "t.csv")), duration_s=5, max_model_len=4096)
    trace = read_trace(spec)
    job = LocustJob.for_plan(TARGET, tmp_path, duration_s=5.0, plan_kwargs=spec_kwargs(spec))
    (tmp_path / "t.csv").unlink()
    plan = job.build_plan(trace)
    assert plan.description["trace"]["rows"] == 12 and len(list(plan.open_loop)) == 12
    with pytest.raises(ConfigError, match="plan_kwargs: 'trace' is not a field of the load"):
        plan_from_spec(**spec_kwargs(spec), trace=str(tmp_path / "t.csv"))
