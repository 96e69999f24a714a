"""What inferring engine steps costs the report of a run without a step log (report/inferred.py's MAX_ROWS).

Synthetic kernel-stamped chunks: `--streams` streams advancing together on `--steps` server steps of
~20 ms (each stamp jittered by up to 40 µs), one row per stream and step. Prints rows, inferred steps,
seconds in `infer_steps` and the process's peak RSS (the synthetic frame included).

    flock /tmp/itlbench-bench.lock python benchmarks/inferred_steps_cost.py --streams 1000 --steps 2000
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import polars as pl

from itlbench.analysis.inferred_steps import infer_steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--steps", type=int, default=2000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    s, n = a.streams, a.steps
    ends = np.cumsum(rng.uniform(0.018, 0.022, n) * 1e9).astype(np.int64)
    ids = [f"r{i}" for i in range(s)]
    chunks = pl.DataFrame({"request_id": np.repeat(ids, n), "index": np.tile(np.arange(n), s),
                           "t_ns": (ends[None, :] + rng.integers(0, 40_000, (s, n))).ravel(),
                           "stamp": ["kernel"] * (s * n), "read_chunks": np.ones(s * n, dtype=np.int64)})
    requests = pl.DataFrame({"request_id": ids, "server_request_id": [None] * s, "sent_ns": [int(ends[0]) - 10**8] * s,
                             "first_token_ns": [int(ends[0])] * s, "prompt_tokens": [64] * s,
                             "prompt_tokens_reported": [64] * s, "cached_tokens_reported": [0] * s},
                            schema_overrides={"server_request_id": pl.Utf8})
    t0 = time.perf_counter()
    inferred = infer_steps(chunks, requests)
    took = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rows {chunks.height:,}  inferred steps {inferred.steps.height:,}  infer_steps {took:.2f} s  "
          f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
