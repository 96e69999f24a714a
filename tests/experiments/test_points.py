"""Sweep axes and points: names, labels, what each point changes, and refusals that name their flag."""

from __future__ import annotations

import pytest

from itlbench.errors import ConfigError
from itlbench.experiments.points import grid, parse_axes
from itlbench.experiments.served import check_template, substitute
from itlbench.experiments.sweep import SweepPlan


def test_budget_and_policy_points_keep_the_directory_names_of_earlier_sweeps() -> None:
    points = grid(parse_axes("256,none", "budget,prefill-first"))
    assert [p.dirname for p in points] == ["b256", "unchunked", "b256-prefill-first", "unchunked-prefill-first"]
    assert points[2].label == "budget 256, prefill-first"
    assert points[0].run_args(served=False) == ["--policy", "budget", "--chunk-budget", "256"]


def test_a_load_axis_crossed_with_budgets_goes_to_run_even_when_served() -> None:
    points = grid(parse_axes("32,none", None, rates="1,2.5"))
    assert [p.dirname for p in points] == ["b32-r1", "b32-r2.5", "unchunked-r1", "unchunked-r2.5"]
    assert points[1].label == "budget 32, rate 2.5"
    assert points[1].run_args(served=True) == ["--rate", "2.5"]  # the budget is in the server's command
    assert points[1].run_args(served=False) == ["--chunk-budget", "32", "--rate", "2.5"]
    assert points[1].placeholders() == {"chunk_budget": "32", "rate": "2.5"}


def test_user_settings_fill_the_template_only() -> None:
    axes = parse_axes("256", None, sets=["mml=1024,4096"])
    points = grid(axes)
    assert [p.dirname for p in points] == ["b256-mml-1024", "b256-mml-4096"]
    assert points[1].run_args(served=True) == []
    cmd = substitute("srv --port {port} -b {chunk_budget} --len {mml}", {"port": "9", **points[1].placeholders()})
    assert cmd == "srv --port 9 -b 256 --len 4096"


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"chunk_budgets": "0"}, "--chunk-budget"),
    ({"chunk_budgets": ","}, "--chunk-budget"),
    ({"chunk_budgets": None, "policies": "fifo"}, "--policy"),
    ({"chunk_budgets": None, "rates": "1,x"}, "--rate"),
    ({"chunk_budgets": None, "streams": "8,-1"}, "--streams"),
    ({"chunk_budgets": None, "streams": "2.5"}, "--streams"),
    ({"chunk_budgets": None, "sets": ["nope"]}, "--set"),
    ({"chunk_budgets": None, "sets": ["port=1,2"]}, "--set"),
    ({"chunk_budgets": None, "sets": ["chunk_budget=1,2"]}, "--set"),
])
def test_bad_axis_values_name_their_flag(kwargs: dict, flag: str) -> None:
    kwargs.setdefault("policies", None)
    with pytest.raises(ConfigError) as err:
        grid(parse_axes(kwargs.pop("chunk_budgets"), kwargs.pop("policies"), **kwargs))
    assert err.value.field == flag


def test_a_value_listed_twice_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        grid(parse_axes("256,256", None))
    assert err.value.field == "--chunk-budget"


@pytest.mark.parametrize(("template", "swept", "says"), [
    ("srv -b {chunk_budget}", ["chunk_budget"], "no {port}"),
    ("srv --port {port}", ["chunk_budget"], "no {chunk_budget}"),
    ("srv --port {port} -b {chunk_budget}", [], "nothing sweeps it"),
    ("srv --port {port} --x {what}", [], "unknown placeholder {what}"),
    ("srv --port {port", [], "does not parse"),
])
def test_templates_that_cannot_work_are_refused_before_anything_starts(template: str, swept: list[str],
                                                                        says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_template(template, swept)
    assert err.value.field == "--serve" and says in str(err.value)


def test_own_settings_need_a_template_and_repeat_must_be_positive() -> None:
    with pytest.raises(ConfigError) as err:
        SweepPlan(parse_axes(None, None, sets=["a=1,2"]))
    assert err.value.field == "--set"
    with pytest.raises(ConfigError) as err:
        SweepPlan(parse_axes("256", None), repeat=0)
    assert err.value.field == "--repeat"


def test_policy_both_is_budget_and_prefill_first() -> None:
    """The help and the refusal offer `both`: it must be taken."""
    points = grid(parse_axes("512", "both"))
    assert [p.dirname for p in points] == ["b512", "b512-prefill-first"]
    with pytest.raises(ConfigError) as err:
        parse_axes("512", "both,budget")
    assert err.value.field == "--policy" and "both already means budget,prefill-first" in str(err.value)


@pytest.mark.parametrize(("kwargs", "flag", "says"), [
    ({"chunk_budgets": "8k,8192"}, "--chunk-budget", "'8k' and '8192' are the same budget"),
    ({"chunk_budgets": "512,0.5k"}, "--chunk-budget", "'512' and '0.5k' are the same budget"),
    ({"chunk_budgets": "none,off"}, "--chunk-budget", "'none' and 'off' are the same budget"),
    ({"chunk_budgets": "none,-1", "served": True}, "--chunk-budget", "'none' and '-1' are the same budget"),
    ({"rates": "1,1.0"}, "--rate", "'1' and '1.0' are the same rate"),
    ({"streams": "8,08"}, "--streams", "'8' and '08' are the same streams"),
    ({"max_num_seqs": "32,32"}, "--max-num-seqs", "'32' is listed twice"),
])
def test_values_that_mean_the_same_are_refused_not_run_twice(kwargs: dict, flag: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_axes(kwargs.pop("chunk_budgets", None), None, **kwargs)
    assert err.value.field == flag and says in str(err.value)


def test_minus_one_is_unchunked_in_a_serve_template_and_refused_for_the_bundled_engine() -> None:
    """SGLang's --chunked-prefill-size -1 turns chunking off; docs/reports.md's example sweeps it."""
    points = grid(parse_axes("512,2048,-1", None, served=True))
    assert [p.dirname for p in points] == ["b512", "b2048", "unchunked"]
    assert points[2].label == "unchunked" and points[2].placeholders() == {"chunk_budget": "-1"}
    with pytest.raises(ConfigError) as err:
        parse_axes("512,-1", None)
    assert err.value.field == "--chunk-budget" and "the bundled engine spells it none" in str(err.value)
