#!/usr/bin/env bash
# The suite with a CPU hog beside it: TAO_HOG_PROCESSES (2 by default) busy processes at nice 0 for the whole run,
# as a busy laptop or a shared CI runner would have them. A test that passes here does not race the machine.
#
#   bash scripts/test-under-load.sh                   # the whole CI run (scripts/test.sh: install, backends, lint, pytest)
#   bash scripts/test-under-load.sh tests/e2e         # the same, its pytest limited to these arguments
#   bash scripts/test-under-load.sh --pytest tests/e2e tests/explorer tests/integration
#                                                     # pytest only, in the current environment, lanes as test.sh runs them
#
# The hogs are stopped (by pid) however the run ends; the exit code is the run's. The wall time and how busy the
# machine was are printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
HOGS=${TAO_HOG_PROCESSES:-2}
pids=()
stop_hogs() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for _ in $(seq "$HOGS"); do
  nice -n 0 sh -c 'while :; do :; done' &
  pids+=("$!")
done
echo "==> CPU hog: $HOGS busy processes at nice 0 (pids ${pids[*]})"
t0=$(date +%s)
set +e
if [ "${1:-}" = "--pytest" ]; then
  shift
  python -m pytest -p no:cacheprovider -ra --durations=15 -n "${TAO_TEST_WORKERS:-2}" "$@"
else
  bash scripts/test.sh "$@"
fi
rc=$?
set -e
read -r load1 load5 load15 _ < /proc/loadavg || true
echo "==> under load ($HOGS hog processes): exit code $rc after $(( $(date +%s) - t0 )) s; load average now $load1 $load5 $load15"
exit "$rc"
