"""BurstGPT CSV and Mooncake JSONL beside the Azure CSV: samples written here, replayed like any trace."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from itlbench.errors import ConfigError
from itlbench.workloads import LoadSpec, build_load_plan, load_trace

# BurstGPT's published columns; Timestamp is seconds from the trace start, failed requests answer 0 tokens
BURST = [(5.0, "ChatGPT", 472, 18, 490, "Conversation log"), (45.0, "ChatGPT", 1087, 0, 1087, "Conversation log"),
         (46.5, "GPT-4", 417, 276, 693, "API log"), (50.25, "ChatGPT", 38, 201, 239, "Conversation log")]
# Mooncake's: timestamp in ms, hash_ids one per 512-token block; rows 0 and 2 share their first two blocks
MOON = [{"timestamp": 0, "input_length": 1200, "output_length": 12, "hash_ids": [10, 11, 12]},
        {"timestamp": 1500, "input_length": 300, "output_length": 40, "hash_ids": [20]},
        {"timestamp": 2750, "input_length": 1100, "output_length": 8, "hash_ids": [10, 11, 13]},
        {"timestamp": 4000, "input_length": 700, "output_length": 5, "hash_ids": []}]


@pytest.fixture
def burst_csv(tmp_path: Path) -> Path:
    path = tmp_path / "BurstGPT_sample.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"])
        w.writerows(BURST)
    return path


@pytest.fixture
def moon_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "mooncake_sample.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOON))
    return path


def test_burstgpt_rows_keep_their_gaps_and_lengths(burst_csv: Path) -> None:
    trace = load_trace(burst_csv)
    assert trace.format == "burstgpt"
    np.testing.assert_allclose(trace.offsets_s, [0.0, 41.5, 45.25])  # the row of 0 output tokens is skipped
    assert trace.prompt_tokens.tolist() == [472, 417, 38]
    assert trace.output_tokens.tolist() == [18, 276, 201]
    assert trace.invalid_rows == 1
    later = load_trace(burst_csv, offset=2)
    np.testing.assert_allclose(later.offsets_s, [0.0, 3.75])


def test_mooncake_rows_in_seconds_and_shared_blocks_give_shared_prefixes(moon_jsonl: Path) -> None:
    trace = load_trace(moon_jsonl)
    assert trace.format == "mooncake"
    np.testing.assert_allclose(trace.offsets_s, [0.0, 1.5, 2.75, 4.0])
    assert trace.prompt_tokens.tolist() == [1200, 300, 1100, 700]
    assert trace.blocks == ((10, 11, 12), (20,), (10, 11, 13), ())
    plan = build_load_plan(LoadSpec(workload="trace", trace_path=str(moon_jsonl), duration_s=10.0,
                                    max_model_len=4096))
    a, b, c, d = (p.prompt_token_ids or () for p in plan.open_loop)
    assert [len(x) for x in (a, b, c, d)] == [1200, 300, 1100, 700]
    assert a[:1024] == c[:1024], "two blocks in common: 1024 tokens in common"
    assert a[1024:1100] != c[1024:1100], "the third block differs"
    assert b[:300] != a[:300] and d[:512] != a[:512]


def test_bad_records_name_the_flag_and_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(MOON[0]) + "\n" + json.dumps({"timestamp": 5, "input_length": 3}) + "\n")
    with pytest.raises(ConfigError, match="line 2 is not a Mooncake record") as err:
        load_trace(bad)
    assert err.value.field == "--trace"
    unsorted = tmp_path / "unsorted.jsonl"
    unsorted.write_text("".join(json.dumps(r) + "\n" for r in reversed(MOON)))
    with pytest.raises(ConfigError, match="not sorted"):
        load_trace(unsorted)
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Request tokens,Response tokens\nsoon,1,2\n")
    with pytest.raises(ConfigError, match="bad value"):
        load_trace(burst)
