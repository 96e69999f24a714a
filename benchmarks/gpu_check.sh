#!/usr/bin/env bash
# The CUDA engine's check on one GPU (H100/H200; about 5 minutes, at most 8.6): kernel correctness vs
# SDPA, Llama-3.1-8B decode steps vs the HBM floor, prefill MFU at 2k and 32k, the source documents'
# scenario (32 streams, one 32k injection, unchunked vs budget 2048), and the simulator's preset on the same
# shapes with a calibration on the scenario's steps. Prints each section and writes every figure to
# $OUT_DIR/gpu_check.json.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU box, from the repo root
#   bash benchmarks/gpu_check.sh --dry-run       # on any CPU box: tiny shapes, checks the script only
#
# Environment: OUT_DIR (default reports/gpu-check-<time>; with OUT set, the main files are copied there too), GPU_CHECK_INSTALL=1 to try
# `pip install triton flash-attn nvtx` when they are missing (needs a package index), SECTIONS
# (default "env kernels decode prefill scenario sim"), PYTHON (default python3).
# Each section runs in its own process under a time limit; one that fails or times out is reported
# and the others still run. Exit status: 0 when every section passed, 1 otherwise.
set -euo pipefail

cd "$(dirname "$0")/.."
DRY_RUN=""
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN="--dry-run"; fi
PYTHON="${PYTHON:-$(command -v python3 || command -v python || echo python3)}"
OUT_DIR="${OUT_DIR:-reports/gpu-check-$(date +%Y%m%d-%H%M%S)}"
SECTIONS="${SECTIONS:-env kernels decode prefill scenario sim}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if [[ -n "$DRY_RUN" ]]; then export TRITON_INTERPRET=1; fi
start=$(date +%s)

# seconds each section may take on the GPU box: 8.6 minutes if every one ran to its limit
declare -A LIMIT=([env]=30 [kernels]=75 [decode]=120 [prefill]=60 [scenario]=170 [sim]=60)
if [[ -n "$DRY_RUN" ]]; then LIMIT=([env]=60 [kernels]=300 [decode]=300 [prefill]=300 [scenario]=300 [sim]=120); fi

echo "== packages"
if compgen -G ".whl/*.whl" >/dev/null; then  # carried by benchmarks/gpu_wheels.sh for a box without an index
  site="${TMPDIR:-/tmp}/itlbench-site"
  "$PYTHON" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl \
    && export PYTHONPATH="$site:$PYTHONPATH" && echo "installed $(ls .whl | tr '\n' ' ')into $site" \
    || echo "the wheels in .whl/ did not install; the check goes on without them"
fi
# one interpreter answers every package question: each `python -c "import torch"` of its own took 1-2 s
probe=$("$PYTHON" - 2>/dev/null <<'EOF'
import importlib
try:
    import torch
except Exception as exc:  # whatever stops the import
    print(f"NOTORCH {type(exc).__name__}: {exc}")
    raise SystemExit(0)
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, device visible: {torch.cuda.is_available()}")
for mod in ("triton", "flash_attn", "nvtx"):
    try:
        print(f"{mod}: {getattr(importlib.import_module(mod), '__version__', 'present')}")
    except Exception:
        print(f"ABSENT {mod}")
try:  # env, kernels, decode and prefill need torch and numpy only; the scenario drives `itlbench run`
    for mod in ("aiohttp", "polars", "typer", "rich", "psutil"):
        importlib.import_module(mod)
except Exception:
    print("NODEPS")
EOF
)
if [[ "$probe" == NOTORCH* ]]; then echo "torch is not importable by $PYTHON (${probe#NOTORCH }): pip install -e . first" >&2; exit 2; fi
while IFS= read -r line; do
  if [[ "$line" == "ABSENT "* ]]; then
    mod="${line#ABSENT }"
    if [[ "${GPU_CHECK_INSTALL:-0}" == "1" && -z "$DRY_RUN" ]]; then
      pkg="${mod/_/-}"
      echo "$mod missing: pip install $pkg (at most 120 s)"
      # flash-attn builds against the installed torch; without a matching wheel it compiles for long
      timeout 120 "$PYTHON" -m pip install --no-build-isolation "$pkg" >"$OUT_DIR/pip-$pkg.log" 2>&1 \
        && echo "  installed" || echo "  not installed (see $OUT_DIR/pip-$pkg.log); the check goes on without it"
    else
      echo "$mod: not installed (its backend is skipped; GPU_CHECK_INSTALL=1 tries pip)"
    fi
  elif [[ "$line" == NODEPS ]]; then
    if [[ "${GPU_CHECK_INSTALL:-0}" == "1" && -z "$DRY_RUN" ]]; then
      echo "itlbench's dependencies missing: pip install -e . (at most 180 s)"
      timeout 180 "$PYTHON" -m pip install -e . >"$OUT_DIR/pip-itlbench.log" 2>&1 \
        && echo "  installed" || echo "  not installed (see $OUT_DIR/pip-itlbench.log)"
    else
      echo "itlbench's dependencies are missing (pip install -e .): the scenario section will fail"
    fi
  else
    echo "$line"
  fi
done <<<"$probe"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm \
  --format=csv,noheader || echo "nvidia-smi: not found"

failed=()
for section in $SECTIONS; do
  echo
  if [[ -z "${LIMIT[$section]:-}" ]]; then  # known without starting Python (which imports torch first)
    echo "!! $section failed (no such section: use ${!LIMIT[*]})" | tee "$OUT_DIR/$section.log"
    printf '{"section": "%s", "error": "no such section"}\n' "$section" >"$OUT_DIR/$section.json"
    failed+=("$section")
    continue
  fi
  echo "== $section (limit ${LIMIT[$section]} s)"
  t0=$(date +%s)
  rc=0
  timeout --kill-after=10 "${LIMIT[$section]}" \
    "$PYTHON" benchmarks/gpu_check.py "$section" --out "$OUT_DIR/$section.json" $DRY_RUN \
    2>&1 | tee "$OUT_DIR/$section.log" || rc=$?
  if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out" || why="exit $rc"
    echo "!! $section failed ($why) after $(( $(date +%s) - t0 )) s; log: $OUT_DIR/$section.log"
    failed+=("$section")
    # keep a record even when the section died before writing its JSON
    [[ -f "$OUT_DIR/$section.json" ]] || printf '{"section": "%s", "error": "%s"}\n' "$section" "$why" \
      >"$OUT_DIR/$section.json"
  fi
done

echo
echo "== summary ($(( $(date +%s) - start )) s in all)"
"$PYTHON" - "$OUT_DIR" "${failed[*]:-}" <<'EOF'
import json, sys
from pathlib import Path
out, failed = Path(sys.argv[1]), sys.argv[2].split()
doc = {"failed_sections": failed, "sections": {}}
for f in sorted(out.glob("*.json")):
    if f.name == "gpu_check.json":
        continue
    try:
        doc["sections"][f.stem] = json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        doc["sections"][f.stem] = {"error": f"unreadable: {exc}"}
(out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
s = doc["sections"]
if "kernels" in s and "ok" in s["kernels"]:
    print(f"kernels vs SDPA: {'PASS' if s['kernels']['ok'] else 'FAIL'}")
for r in s.get("decode", {}).get("rows", []):
    if "step_ms" in r:
        print(f"decode {r['attention']:<6} graphs={r['cuda_graphs']!s:<5} batch {r['batch']:>3}: "
              f"{r['step_ms']:.2f} ms ({r['x_floor']:.2f}x the {r['floor_ms']:.2f} ms floor)")
for r in s.get("prefill", {}).get("rows", []):
    if "seconds" in r:
        mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") else ""
        print(f"prefill {r['attention']:<6} {r['tokens']:>6} tokens: {r['seconds']:.3f} s{mfu}")
for r in s.get("scenario", {}).get("rows", []):
    if "itl_p99_s" in r:
        ms = lambda x: "n/a" if x is None else f"{x * 1e3:.1f} ms"
        print(f"scenario budget {r['chunk_budget']:>5}: ITL p99 {ms(r['itl_p99_s'])}, worst {ms(r['itl_max_s'])}, "
              f"injected TTFT {ms(r['injected_ttft_s'])}")
for r in s.get("sim", {}).get("rows", []):
    print(f"sim {r['kind']:<7} {r['attention']:<6} graphs ran={r['graph_ran']!s:<5} {r['shape']}: measured "
          f"{r['measured_s'] * 1e3:.2f} ms, {s['sim']['preset']} preset {r['sim_s'] * 1e3:.2f} ms ({r['error']:+.1%})")
print(f"failed sections: {', '.join(failed) or 'none'}")
print(out / "gpu_check.json")
EOF
# A remote runner's $OUT folder, when one is set, sends back what is written there (a few files, not trees):
# the figures, the calibration, every section's log in one file and the scenario's runs in one archive.
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp "$OUT_DIR/gpu_check.json" "$OUT/" || true
  [[ -f "$OUT_DIR/calibrated.json" ]] && cp "$OUT_DIR/calibrated.json" "$OUT/" || true
  cat "$OUT_DIR"/*.log >"$OUT/gpu_check.log" 2>/dev/null || true
  runs=$(cd "$OUT_DIR" && ls -d scenario-* 2>/dev/null || true)
  [[ -n "$runs" ]] && tar -czf "$OUT/scenario-runs.tar.gz" -C "$OUT_DIR" $runs || true
  echo "copied to $OUT: $(ls "$OUT" | tr '\n' ' ')"
fi
[[ ${#failed[@]} -eq 0 ]]
