#!/usr/bin/env bash
# Peak memory of `kvbench run --limit 1` against the size of the problem file (issue 43): problem
# files are streamed, so the peak must stay flat from 10 thousand to millions of rows. Writes the
# files to a temporary folder, runs each once with a random-weight model (no download), prints
# rows, file size, peak RSS and wall time. Usage: scripts/bench_data_memory.sh [ROWS ...]
set -euo pipefail
cd "$(dirname "$0")/.."
kv=${KVBENCH_BIN:-target/release/kvbench}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(10000 100000 1000000 5000000)
printf "| rows | file MB | peak RSS MiB | wall s |\n|---:|---:|---:|---:|\n"
for n in "${rows[@]}"; do
    f="$tmp/p$n.jsonl"
    awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "{\"id\": \"p%d\", \"problem\": \"What is %d plus %d? Give the sum of the two numbers.\", \"answer\": \"%d\"}\n", i, i, i, 2 * i }' > "$f"
    /usr/bin/time -f "%M %e" -o "$tmp/time" "$kv" run --model random:tiny --data "$f" --limit 1 \
        --max-new-tokens 1 --no-baseline --out "$tmp/out-$n" > /dev/null 2>&1
    read -r kib secs < "$tmp/time"
    printf "| %d | %.0f | %.0f | %s |\n" "$n" "$(($(stat -c %s "$f") / 1000000))" "$((kib / 1024))" "$secs"
done
