#!/usr/bin/env bash
# Run the peer harnesses once each against one OpenAI-compatible server: N concurrent streams,
# fixed prompt and output lengths, streamed /v1/completions, EOS ignored.
# Usage: benchmarks/peers/run_harnesses.sh BASE_URL MODEL TOKENIZER_DIR OUT_DIR [STREAMS ISL OSL REQUESTS [HARNESSES]]
#   BASE_URL       server root without /v1, e.g. http://127.0.0.1:8080
#   MODEL          served model name
#   TOKENIZER_DIR  a directory with tokenizer.json (an `itlbench export-model` directory)
#   HARNESSES      any of "vllm aiperf guidellm" (default: all three)
# Results: OUT_DIR/vllm-bench/result.json, OUT_DIR/aiperf/ (profile_export*.json[l]),
# OUT_DIR/guidellm/benchmarks.json; each harness's console output in OUT_DIR/<harness>.log.
# Venvs: $VLLM_VENV, $AIPERF_VENV, $GUIDELLM_VENV (defaults under $HOME/peers; see
# install_vllm.sh and install_harnesses.sh).
set -euo pipefail

if [[ $# -lt 4 ]]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
URL=$1 MODEL=$2 TOK=$3 OUT=$4
STREAMS=${5:-4} ISL=${6:-128} OSL=${7:-64} N=${8:-16}
HARNESSES=${9:-"vllm aiperf guidellm"}
VLLM_VENV=${VLLM_VENV:-$HOME/peers/vllm-venv}
AIPERF_VENV=${AIPERF_VENV:-$HOME/peers/aiperf-venv}
GUIDELLM_VENV=${GUIDELLM_VENV:-$HOME/peers/guidellm-venv}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for h in $HARNESSES; do
  case $h in
  vllm)
    # pooled per-gap ITL in the summary; per-request lists with --save-detailed
    mkdir -p "$OUT/vllm-bench"
    VLLM_TARGET_DEVICE=cpu "$VLLM_VENV/bin/vllm" bench serve --backend openai --base-url "$URL" \
      --endpoint /v1/completions --model "$MODEL" --tokenizer "$TOK" \
      --dataset-name random --random-input-len "$ISL" --random-output-len "$OSL" --random-range-ratio 0 \
      --ignore-eos --temperature 0 --num-prompts "$N" --max-concurrency "$STREAMS" --request-rate inf \
      --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99,99.9 \
      --save-result --save-detailed --result-dir "$OUT/vllm-bench" --result-filename result.json \
      --disable-tqdm --seed 0 >"$OUT/vllm.log" 2>&1
    ;;
  aiperf)
    "$AIPERF_VENV/bin/aiperf" profile --model "$MODEL" --url "$URL" --endpoint-type completions --streaming \
      --tokenizer "$TOK" --concurrency "$STREAMS" --request-count "$N" \
      --isl "$ISL" --prompt-input-tokens-stddev 0 --prompt-output-tokens-mean "$OSL" \
      --prompt-output-tokens-stddev 0 --extra-inputs ignore_eos:true --random-seed 0 \
      --artifact-dir "$OUT/aiperf" --export-level raw --ui-type none >"$OUT/aiperf.log" 2>&1
    ;;
  guidellm)
    mkdir -p "$OUT/guidellm"
    "$GUIDELLM_VENV/bin/guidellm" run \
      --backend "kind=openai_http,target=$URL,model=$MODEL,request_format=/v1/completions" \
      --profile "kind=concurrent,streams=$STREAMS" --constraint "kind=max_requests,count=$N" \
      --tokenizer "kind=hf_auto,model=$TOK" \
      --data "kind=synthetic_text,prompt_tokens=$ISL,output_tokens=$OSL" \
      --seed kind=static,value=0 --output "kind=json,path=$OUT/guidellm/benchmarks.json" \
      --disable-console-interactive >"$OUT/guidellm.log" 2>&1
    ;;
  *)
    echo "unknown harness $h (use vllm, aiperf, guidellm)" >&2
    exit 2
    ;;
  esac
  echo "$h: done ($OUT/$h.log)"
done
