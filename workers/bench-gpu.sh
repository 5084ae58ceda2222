#!/usr/bin/env bash
# The GPU command: MFU of phase-1 training (preset 300m, sequence length 512, bf16) and the
# GPU paths checked against their CPU-tested oracles, on one CUDA GPU, within 10 minutes.
#
#   workers/bench-gpu.sh [extra `embedlab bench mfu` options, e.g. --batch-rows 32 --no-compile]
#
# Runs from the repository root with $PYTHON (default: .venv/bin/python if present, else
# python3), which needs a CUDA build of torch (>= 2.10, for the variable-length flash kernel)
# with triton, and numpy, pandas, pyarrow, scipy, safetensors and tokenizers; Ray, Faiss,
# Optuna and datasets are not needed. The first step imports what the rest does, so a
# missing package stops it at once with its name.
#
# 1. `embedlab bench mfu --json`: checks the flash kernel first (the dense mask is timed
#    instead if it fails), then tokens/s, model TFLOP/s, peak, MFU, peak memory and
#    "before_after" (bf16 autocast vs fp32, compiled vs eager), and "profile" (top kernels by
#    device time, GPU busy share). On a failure it retries once without compile and on the
#    dense mask (a CUDA fault in a kernel poisons the process, and the retry must not touch
#    it again). Written to $OUT/bench-mfu.json when $OUT is set.
# 2. `embedlab model check-cuda --json` with the time left: flash varlen, encoder paths,
#    device vs CPU, NCCL collectives, host reads (a step under sync debug mode), compiled
#    step. Written to $OUT/cuda-checks.json.
# Exits non-zero if the bench failed or a check did not pass; each part's JSON is printed
# either way.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="platform${PYTHONPATH:+:$PYTHONPATH}"
# Budget: bench compile (~1-2 min) + 25 steps of ~0.1-0.3 s + two eager runs of 11 steps;
# the checks (a small model, one compile) take about a minute.
deadline=$((SECONDS + 570))
out=${OUT:-}

"$PYTHON" - <<'PY' || exit 1
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}", flush=True)
if not torch.cuda.is_available():
    raise SystemExit("error: bench-gpu.sh needs CUDA (torch.cuda.is_available() is False)")
print(f"device {torch.cuda.get_device_name(0)}", flush=True)
import embedlab.bench.mfu, embedlab.cli, embedlab.bench.cuda_checks, embedlab.train.phase1  # noqa: E401,F401
PY

bench() {
    local left=$((deadline - SECONDS - 90))  # keep ~90 s for the checks
    timeout -k 10 "$left" "$PYTHON" -m embedlab.cli bench mfu --preset 300m --sequence-length 512 --json "$@"
}
status=0
if ! result=$(bench "$@"); then
    if [ $((deadline - SECONDS)) -lt 150 ]; then
        echo "bench mfu failed with too little time left to retry" >&2
        status=1
    else
        echo "bench mfu failed; retrying without compile, on the dense attention mask" >&2
        result=$(bench --no-compile --attention dense "$@") || status=1
    fi
fi
echo "$result"
[ -n "$out" ] && [ -n "$result" ] && echo "$result" > "$out/bench-mfu.json"

left=$((deadline - SECONDS))
if [ "$left" -lt 20 ]; then
    echo "no time left for model check-cuda" >&2
    exit 1
fi
checks=$(timeout -k 10 "$left" "$PYTHON" -m embedlab.cli model check-cuda --json) || status=1
echo "$checks"
[ -n "$out" ] && [ -n "$checks" ] && echo "$checks" > "$out/cuda-checks.json"
exit "$status"
