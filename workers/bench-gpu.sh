#!/usr/bin/env bash
# MFU of phase-1 training, preset 300m at sequence length 512 in bf16, on one CUDA GPU.
#
#   workers/bench-gpu.sh [extra `embedlab bench mfu` options, e.g. --batch-rows 32 --no-compile]
#
# Runs from the repository root with $PYTHON (default: .venv/bin/python if present, else
# python3), which needs a CUDA build of torch (>= 2.13, for the variable-length flash kernel).
# Prints the environment, then one JSON object (tokens/s, model TFLOP/s, peak, MFU, peak
# memory, and "before_after": bf16 autocast vs fp32 and compiled vs eager, short eager runs); writes it to $OUT/bench-mfu.json when $OUT is set. Capped at 9.5 minutes so the
# whole command finishes within 10; on a compile failure it retries once without compile.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="platform${PYTHONPATH:+:$PYTHONPATH}"
# Budget: compile (~1-2 min) + 25 steps of ~0.1-0.3 s + two eager runs of 11 steps; the
# retry keeps what is left.
deadline=$((SECONDS + 570))

"$PYTHON" - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}", flush=True)
if not torch.cuda.is_available():
    raise SystemExit("error: bench-gpu.sh needs CUDA (torch.cuda.is_available() is False)")
print(f"device {torch.cuda.get_device_name(0)}", flush=True)
PY

out=${OUT:-}
run() {
    local left=$((deadline - SECONDS))
    timeout "$left" "$PYTHON" -m embedlab.cli bench mfu --preset 300m --sequence-length 512 --json "$@"
}
if ! result=$(run "$@"); then
    if [ $((deadline - SECONDS)) -lt 60 ]; then
        echo "bench mfu failed with under a minute left; not retrying" >&2
        exit 1
    fi
    echo "bench mfu with torch.compile failed; retrying without compile" >&2
    result=$(run --no-compile "$@")
fi
echo "$result"
if [ -n "$out" ]; then
    echo "$result" > "$out/bench-mfu.json"
fi
