"""Do llama.cpp and the bundled engine serve the same model? Greedy tokens for token-id prompts.

llama-server loads the GGUF written by `itlbench export-model PRESET FILE.gguf --format gguf`; the bundled
engine serves the preset's `itlbench export-model` directory (same seed, so the same weights). The
same token-id prompts go through llama-server's /completion (temperature 0, ignore_eos, no prompt
cache, token ids returned) and the bundled engine's /v1/completions, and the generated ids are compared.
With --logprobs, llama.cpp's top-5 logprobs at each generated position are also checked against
transformers' LlamaForCausalLM on the export directory (teacher-forced on llama.cpp's tokens).

    python -m benchmarks.peers.greedy_parity_llamacpp ~/peers/models/cpu-small.gguf \
        ~/peers/models/cpu-small --lens 6,100,1000,3000
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.peers.greedy_parity import bundled_tokens
from benchmarks.peers.llamacpp_server import LlamaCppConfig, LlamaCppServer


def llamacpp_greedy(url: str, prompt: list[int], max_tokens: int, n_probs: int = 0) -> dict:
    """llama-server's native /completion for token ids: {"tokens": [...], "probs": [...] when asked}."""
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "n_probs": n_probs, "post_sampling_probs": False}
    req = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        doc = json.loads(resp.read())
    if doc.get("tokens_evaluated") != len(prompt):
        raise RuntimeError(f"llama-server evaluated {doc.get('tokens_evaluated')} prompt tokens, "
                           f"sent {len(prompt)} (a BOS added?)")
    return {"tokens": list(doc["tokens"]), "probs": doc.get("completion_probabilities", [])}


def logprob_error(model_dir: Path, prompt: list[int], answer: dict) -> float:
    """Largest gap between llama.cpp's top-5 logprobs and transformers' for the same ids."""
    import torch
    from transformers import LlamaForCausalLM

    global _HF
    if _HF is None or _HF[0] != model_dir:
        _HF = (model_dir, LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval())
    gen = answer["tokens"]
    with torch.no_grad():
        logits = _HF[1](torch.tensor([prompt + gen])).logits[0, len(prompt) - 1:len(prompt) - 1 + len(gen)]
    ref = torch.log_softmax(logits.double(), -1)
    return max(abs(t["logprob"] - ref[i, t["id"]].item())
               for i, step in enumerate(answer["probs"]) for t in step["top_logprobs"])


_HF: tuple[Path, object] | None = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("model_dir", type=Path, help="the same preset's `itlbench export-model` directory")
    ap.add_argument("--lens", default="6,100,1000,3000", help="prompt lengths in tokens")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--chunk-budget", default="2048", help="both engines' tokens per step, or none")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flash-attn", default="off", help="on|off|auto (on is not exact on CPU)")
    ap.add_argument("--cache-type", default="f32", help="K/V cache type (-ctk/-ctv)")
    ap.add_argument("--logprobs", action="store_true", help="also compare top-5 logprobs with transformers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write prompts lengths and both token lists here")
    args = ap.parse_args()
    budget = None if args.chunk_budget.lower() == "none" else int(args.chunk_budget)
    raw = json.loads((args.model_dir / "config.json").read_text())
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, raw["vocab_size"], int(n)).tolist() for n in args.lens.split(",")]
    cfg = LlamaCppConfig(model_path=args.gguf, chunk_budget=budget, n_parallel=1, ctx_size=args.max_model_len,
                         threads=args.threads, flash_attn=args.flash_attn, cache_type=args.cache_type,
                         cache_prompt=False)
    with LlamaCppServer(cfg) as srv:
        print(f"llama-server started in {srv.startup_s:.2f} s (pid {srv.pid}, log {srv.log_path})", flush=True)
        answers = [llamacpp_greedy(srv.url, p, args.max_tokens, n_probs=5 if args.logprobs else 0)
                   for p in prompts]
    theirs = [a["tokens"] for a in answers]
    if args.logprobs:
        for p, a in zip(prompts, answers, strict=True):
            print(f"prompt {len(p):>6} tokens: max |logprob(llama.cpp) - logprob(transformers)| over the top 5 = "
                  f"{logprob_error(args.model_dir, p, a):.2e}", flush=True)
    ours = bundled_tokens(args.model_dir, prompts, args.max_tokens, budget, args.max_model_len)
    same = 0
    for p, a, b in zip(prompts, theirs, ours, strict=True):
        agree = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        same += a == b
        print(f"prompt {len(p):>6} tokens: {'same' if a == b else f'differ from token {agree}'}\n"
              f"  llama.cpp {a}\n  bundled   {b}")
    print(f"{same}/{len(prompts)} prompts: identical greedy tokens (chunk budget {args.chunk_budget})")
    if args.json:
        args.json.write_text(json.dumps({"lens": [len(p) for p in prompts], "llamacpp": theirs, "bundled": ours,
                                         "chunk_budget": args.chunk_budget}, indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
