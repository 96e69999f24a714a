"""benchmarks/harness_truth.py: scoring a harness's per-request figures against a server's log."""

import json

from benchmarks.harness_truth import HarnessRun, Req, Truth, bundled_truth, parse_vllm, score


def test_score_per_gap_per_request_and_surplus():
    ms = 1_000_000
    truth = Truth({"cmpl-1": [10 * ms, 30 * ms, 50 * ms]}, {"cmpl-1": 5 * ms})
    run = HarnessRun("x", [Req("cmpl-1", ttft_ms=6.0, first_abs_ns=11 * ms, gaps_ms=[21.0, 19.0, 0.01],
                               mean_itl_ms=20.5)])
    res = score(run, truth)
    assert res["matched"] == 1
    assert res["itl_gap_error_ms"]["max"] == 1.0 and res["itl_gap_error_ms"]["n"] == 2
    assert res["surplus_gaps"]["n"] == 1  # the finish event's gap, beyond the truth's two
    assert abs(res["itl_mean_error_ms"]["signed_median"] - 0.5) < 1e-9
    assert abs(res["ttft_error_ms"]["signed_median"] - 1.0) < 1e-9  # 6 ms against 10 − 5
    assert abs(res["first_token_stamp_error_ms"]["signed_median"] - 1.0) < 1e-9


def test_vllm_export_matched_by_the_tag_in_its_text(tmp_path):
    (tmp_path / "vllm-bench").mkdir()
    doc = {"generated_texts": [" [cmpl-7] the the", " the"], "errors": ["", ""], "ttfts": [0.01, 0.01],
           "itls": [[0.02, 0.02], [0.02]], "latencies": [0.05, 0.03], "output_lens": [3, 2],
           "start_times": [1.0, 2.0]}
    (tmp_path / "vllm-bench" / "result.json").write_text(json.dumps(doc))
    run = parse_vllm(tmp_path)
    assert [r.sid for r in run.reqs] == ["cmpl-7"] and run.unmatched == 1
    assert abs(run.reqs[0].mean_itl_ms - 20.0) < 1e-9


def test_bundled_truth_runs_from_the_first_token_step():
    steps = [{"end_ns": t, "prefill_request_ids": ids} for t, ids in
             [(100, ["a"]), (200, ["b"]), (300, []), (400, [])]]
    t = bundled_truth(steps, tokens=3)
    assert t.sends == {"a": [100, 200, 300], "b": [200, 300, 400]}
