#!/usr/bin/env bash
# Same outputs at two commits: `make demo`'s tables and `embedlab bench --json`'s keys, each
# commit in its own fresh clone with its own empty data cache, then workers/compare_outputs.py.
# The BEFORE commit's run records are tabled by the AFTER commit too (`table-read-by-after.*`):
# what the comparison reads, so a change of the record schema (a config field moved, read
# through embedlab.core.schema.upgrade) compares what both commits measured, in one layout.
# The check a refactor must pass ("behaviour unchanged"); about 30 min on 2 cores.
#
#   workers/same-outputs.sh BEFORE AFTER [WORK_DIR]     (commits; WORK_DIR default /tmp/same-outputs)
#
# WORK_DIR/NAME/ holds each clone (repo/), its logs, table.STUDY.json and bench.json. The two
# commits run side by side: the comparison is of outputs, not of speed. Exits as the
# comparison does (0: same outputs).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 5p "$0" | sed 's/^# *//' >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${3:-/tmp/same-outputs}
before=$(git -C "$repo" rev-parse --verify "$1^{commit}")
after=$(git -C "$repo" rev-parse --verify "$2^{commit}")

one() {  # one commit: clone, set up, demo, tables, bench
    local commit=$1 dir=$work/$2
    rm -rf "$dir" && mkdir -p "$dir"
    git clone -q "$repo" "$dir/repo" && git -C "$dir/repo" checkout -q "$commit"
    cd "$dir/repo"
    make setup > "$dir/setup.log" 2>&1
    export EMBEDLAB_CACHE=$dir/cache
    make demo > "$dir/demo.log" 2>&1
    for run in runs/*/; do
        study=$(basename "$run" | sed 's/-[0-9]\{8\}-[0-9]\{6\}$//')
        .venv/bin/embedlab table "$run" --json > "$dir/table.$study.json"
    done
    .venv/bin/embedlab bench --json > "$dir/bench.json" 2> "$dir/bench.log"
    echo "$2: $commit done"
}

echo "same-outputs: $before (before) vs $after (after) in $work"
one "$before" before & pid_before=$!
one "$after" after & pid_after=$!
status=0
wait $pid_before || { echo "before: failed, see $work/before/*.log" >&2; status=1; }
wait $pid_after || { echo "after: failed, see $work/after/*.log" >&2; status=1; }
[ $status = 0 ] || exit 1
for run in "$work/before/repo/runs/"*/; do
    study=$(basename "$run" | sed 's/-[0-9]\{8\}-[0-9]\{6\}$//')
    "$work/after/repo/.venv/bin/embedlab" table "$run" --json > "$work/before/table-read-by-after.$study.json"
done
"$repo/.venv/bin/python" "$repo/workers/compare_outputs.py" "$work/before" "$work/after"
