"""Sweeps of several engines compared together: a sweep point's label ("budget 256") names a setting of
one engine, so repeats pool per engine and point, never across engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from itlbench.report.compare_ci import repeat_groups, run_labels


@dataclass
class _Engine:
    name: str
    external: bool = True  # a server's name is its label's prefix; the bundled engine's are in test_compare_verdict


@dataclass
class _Run:
    engine: _Engine
    label: str
    repeat: int
    doc: dict[str, Any] = field(init=False)
    name: str = "run"

    def __post_init__(self) -> None:
        self.doc = {"sweep": {"label": self.label, "repeat": self.repeat, "repeats": 2}}

    def setting_label(self) -> str:
        return f"{self.engine.name}: {self.label}"


def _sweep(engine: str) -> list[_Run]:
    return [_Run(_Engine(engine), f"budget {b}", i) for b in (256, 2048) for i in (1, 2)]


def test_one_engines_sweep_keeps_its_point_labels() -> None:
    runs = _sweep("vLLM")
    assert repeat_groups(runs, run_labels(runs)) == ["budget 256"] * 2 + ["budget 2048"] * 2  # type: ignore[arg-type]


def test_two_engines_budget_256_are_two_settings() -> None:
    runs = _sweep("vLLM") + _sweep("llama.cpp server")
    groups = repeat_groups(runs, run_labels(runs))  # type: ignore[arg-type]
    assert groups == ["vLLM: budget 256"] * 2 + ["vLLM: budget 2048"] * 2 + \
        ["llama.cpp server: budget 256"] * 2 + ["llama.cpp server: budget 2048"] * 2
    assert run_labels(runs)[0] == "vLLM: budget 256 (#1)"  # type: ignore[arg-type]
