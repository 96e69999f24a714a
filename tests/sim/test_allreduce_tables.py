"""Measured all-reduce times in a profile: interpolated in place of the link's price, carried through a profile JSON,
and refused in one line when malformed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from itlbench.core.presets import PRESETS
from itlbench.errors import ConfigError
from itlbench.sim.allreduce_tables import (
    ALLREDUCE_2025_US,
    MESSAGE_BYTES,
    interpolate,
    lower_envelope,
    measured_tables,
)
from itlbench.sim.hardware import load_hardware
from itlbench.sim.roofline import CostModel

POINTS = ((1024.0, 4e-6), (4096.0, 8e-6), (16384.0, 32e-6))


def test_interpolation_is_exact_at_the_points_log_log_between_and_the_last_bandwidth_past_them() -> None:
    assert [interpolate(POINTS, b) for b, _ in POINTS] == pytest.approx([t for _, t in POINTS], rel=1e-12)
    assert interpolate(POINTS, 2048.0) == pytest.approx(math.sqrt(4e-6 * 8e-6))  # halfway in log size: geometric mean
    assert interpolate(POINTS, 1.0) == 4e-6  # below the table: the smallest message's fixed cost
    bw = (16384 - 4096) / (32e-6 - 8e-6)
    assert interpolate(POINTS, 32768.0) == pytest.approx(32e-6 + 16384 / bw)


def test_a_size_measured_slower_than_a_larger_one_takes_the_larger_ones_time() -> None:
    assert lower_envelope([5.0, 14.8, 6.5, 8.0]) == (5.0, 6.5, 6.5, 8.0)
    a100 = dict(measured_tables("a100")["8"])
    assert ALLREDUCE_2025_US["a100"][1][8][2] == 14.8 and a100[4096] == pytest.approx(6.54e-6)


def test_a_2025_profile_prices_its_all_reduces_from_vllms_table_and_the_preset_from_its_link() -> None:
    """A 2,048-row prefill chunk of the 70B at TP8 all-reduces 32 MiB: vLLM's table gives 0.18 ms (between 92 us at
    16 MiB and 344 us at 64 MiB) where the preset's link price (5 us plus the message at NVLink SHARP's share) gives
    0.13 ms."""
    model = PRESETS["llama-3.3-70b"]
    message = 2048 * model.hidden_size * 2
    costs = {}
    for name in ("h100", "h100-2025"):
        hw = load_hardware(name)
        costs[name] = CostModel.for_hardware(model, hw, tp=8).allreduce_s(2048, hw)
    assert costs["h100-2025"] == pytest.approx(interpolate(measured_tables("h100")["8"], message))
    assert 0.17e-3 < costs["h100-2025"] < 0.19e-3 and 0.12e-3 < costs["h100"] < 0.135e-3, costs
    hw = load_hardware("h100-2025")
    assert CostModel.for_hardware(model, hw, tp=1).allreduce_s(2048, hw) == 0.0  # no peers, no all-reduce


def test_the_table_survives_a_profile_json_and_a_malformed_one_is_one_line(tmp_path: Path) -> None:
    hw = load_hardware("h100-2025")
    path = tmp_path / "h100-2025.json"
    hw.save(path)
    again = load_hardware(str(path))
    assert again == hw and again.allreduce_measured["4"][0] == (float(MESSAGE_BYTES[0]), hw.allreduce_measured["4"][0][1])
    raw = json.loads(path.read_text())
    for bad in ({"8": [[1024, 4e-6]]}, {"8": [[4096, 4e-6], [1024, 8e-6]]}, {"one": [[1, 1e-6], [2, 2e-6]]},
                {"8": [[1024, -1.0], [2048, 1e-6]]}, [[1024, 4e-6]]):
        path.write_text(json.dumps({**raw, "allreduce_measured": bad}))
        with pytest.raises(ConfigError) as err:
            load_hardware(str(path))
        assert err.value.field == "--gpu" and "\n" not in str(err.value)
        assert err.value.problem.startswith(f"{path}: allreduce_measured ")
