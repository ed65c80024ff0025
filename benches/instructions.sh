#!/usr/bin/env bash
# Instruction counts per call of ingest, compaction, assemble at 128k and grep (by words, by
# meaning and both: grep-semantic, grep-hybrid; every thread's instructions), at T = 1,000,
# under callgrind: figures that do not drift with a shared machine's speed.
#
#   bash benches/instructions.sh TRANSCRIPT NEEDLES [WORKLOAD]
#
# WORKLOAD is the runner built with its `instructions` feature (default: built here, release).
# It runs at full speed until turn
# 800, then marks the calls to count (see vilvona_benches::Instructions); each dump names its
# operation and how many calls it holds. Prints one line per operation: instructions per call.
#
# Counts hold still because nothing runs in a window by the clock: the index commits by
# document count only (VILVONA_INDEX_COMMIT_MS is set past the run's end), and the runner
# merges the index into one segment before each window, so no background merge lands in one.
set -euo pipefail
transcript=${1:?the transcript (gen_session.py --turns 1000)}
needles=${2:?the needles file}
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 1; }
workload=${3:-}
if [ -z "$workload" ]; then
  cargo build --release --quiet -p vilvona-benches --features instructions --bin workload
  workload=target/release/workload
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
VILVONA_INDEX_COMMIT_MS=3600000 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/cg.%p" \
  "$workload" --transcript "$transcript" --needles "$needles" --instructions --json \
  >"$out/figures.json" 2>"$out/valgrind.log" || { cat "$out/valgrind.log" >&2; exit 1; }
found=0
for dump in "$out"/cg.*.*; do
  awk '
    /^desc: Trigger: Client Request: / { name = $5; calls = $6 }
    /^(totals|summary): / { total = $2 }
    END { if (name != "" && calls > 0) printf "%-12s %14.0f instructions per call (%d calls)\n", name, total / calls, calls }
  ' "$dump"
  found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "instructions.sh: callgrind wrote no dumps" >&2; exit 1; }
