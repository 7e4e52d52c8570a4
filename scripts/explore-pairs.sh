#!/usr/bin/env bash
# The pair explorer's whole product (docs/reliability.md, "The pair explorer"): every pair of every single schedule,
# one pytest process per platform so that the platforms use every core (a process's threads share one), at most
# TAO_EXPLORE_PROCESSES (the cores) at once. Run after scripts/test.sh has made the environment and the backends.
#
#   bash scripts/explore-pairs.sh                         # all six platforms
#   bash scripts/explore-pairs.sh lepton brev             # these platforms
#   TAO_EXPLORE_PAIR_RESUME=1 bash scripts/explore-pairs.sh brev   # on from where an earlier run stopped
#
# Each pair's result is one JSON line in $TAO_EXPLORE_OUT/pairs-<platform>.jsonl as it ends (a violation's line
# holds its reproducer; a resumed run appends to it and runs only the pairs with no passing line yet), each
# platform's pytest output in $TAO_EXPLORE_OUT/pairs-<platform>.log. The exit code is 0 only if every platform's
# product ran with no violation; its summary line (product, explored, violations, CPU seconds) is printed per
# platform at the end. Each report is kept, gzipped, in tests/explorer/sittings/ (committed: the record behind
# docs/reliability.md's counts, and where a resumed run on a fresh clone goes on from).
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=("$@")
[ ${#platforms[@]} -gt 0 ] || platforms=(local docker kubernetes slurm lepton brev)
OUT=${TAO_EXPLORE_OUT:-build/explore-pairs}
PROCESSES=${TAO_EXPLORE_PROCESSES:-$(nproc)}
mkdir -p "$OUT"
t0=$(date +%s)
run_platform() {
  TAO_EXPLORE_PAIRS=all TAO_EXPLORE_PLATFORMS="$1" TAO_EXPLORE_SLICED= \
    TAO_EXPLORE_PAIR_REPORT="$OUT/pairs-$1.jsonl" \
    python -m pytest -p no:cacheprovider --timeout=0 -s -q tests/explorer -k "test_pairs and $1" > "$OUT/pairs-$1.log" 2>&1
  echo $? > "$OUT/pairs-$1.rc"
}
KEPT=tests/explorer/sittings
mkdir -p "$KEPT"
for platform in "${platforms[@]}"; do
  if [ -z "${TAO_EXPLORE_PAIR_RESUME:-}" ]; then
    rm -f "$OUT/pairs-$platform.jsonl"
  elif [ ! -e "$OUT/pairs-$platform.jsonl" ] && [ -e "$KEPT/pairs-$platform.jsonl.gz" ]; then
    gzip -dc "$KEPT/pairs-$platform.jsonl.gz" > "$OUT/pairs-$platform.jsonl"  # a fresh clone: on from the kept record
  fi
  rm -f "$OUT/pairs-$platform.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$PROCESSES" ]; do sleep 1; done
  echo "==> $platform pairs: $OUT/pairs-$platform.log"
  run_platform "$platform" &
done
wait
rc=0
for platform in "${platforms[@]}"; do
  grep -h "^$platform pairs: " "$OUT/pairs-$platform.log" || echo "$platform pairs: no summary (see $OUT/pairs-$platform.log)"
  [ "$(cat "$OUT/pairs-$platform.rc" 2>/dev/null)" = 0 ] || rc=1
  gzip -9c "$OUT/pairs-$platform.jsonl" > "$KEPT/pairs-$platform.jsonl.gz"
done
echo "==> over every sitting (python -m tests.explorer.pair_report):"
reports=(); for platform in "${platforms[@]}"; do reports+=("$OUT/pairs-$platform.jsonl"); done
python -m tests.explorer.pair_report "${reports[@]}" | sed 's/^/    /' || true
echo "==> pair product of ${platforms[*]}: exit code $rc after $(( $(date +%s) - t0 )) s"
exit "$rc"
