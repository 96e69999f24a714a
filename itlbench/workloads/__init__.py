"""Workloads: what to send (catalog, prompts, traces, injections) and when (arrivals)."""

from itlbench.workloads.arrivals import arrival_times, gamma_gaps
from itlbench.workloads.build import DEFAULT_STREAMS, LoadSpec, build_load_plan
from itlbench.workloads.catalog import (
    CATALOG,
    Sessions,
    SharedPrefix,
    WorkloadSpec,
    catalog_table,
    get_workload,
)
from itlbench.workloads.injection import Injection, injection_times, parse_injections
from itlbench.workloads.plan import LoadPlan, RequestPlan
from itlbench.workloads.prompts import WORDS, Prompt, PromptBuilder
from itlbench.workloads.sampling import lognormal_mu, sample_length, sample_lengths
from itlbench.workloads.trace import COLUMNS, Trace, TraceReplay, load_trace, replay

__all__ = [
    "CATALOG", "COLUMNS", "DEFAULT_STREAMS", "WORDS", "Injection", "LoadPlan", "LoadSpec", "Prompt",
    "PromptBuilder", "RequestPlan", "Sessions", "SharedPrefix", "Trace", "TraceReplay",
    "WorkloadSpec", "arrival_times", "build_load_plan", "catalog_table", "gamma_gaps",
    "get_workload", "injection_times", "lognormal_mu", "load_trace", "parse_injections",
    "replay", "sample_length", "sample_lengths",
]
