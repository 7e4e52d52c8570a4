#!/usr/bin/env bash
# Run the quickstart DAG (example_dags/tao_quickstart.py) end to end on the `local` platform.
# Needs only Python 3.11 or 3.12 and pip: creates .venv-quickstart (or uses $VENV), installs the provider, runs
# `airflow dags test tao_quickstart` in a private AIRFLOW_HOME (.quickstart/airflow) and prints where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${VENV:-$ROOT/.venv-quickstart}
QUICKSTART_DIR=${QUICKSTART_DIR:-$ROOT/.quickstart}  # another folder lets two runs (3.11 and 3.12) run at once
export AIRFLOW_HOME=$QUICKSTART_DIR/airflow
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/example_dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
LOG=$QUICKSTART_DIR/quickstart.log

step() { printf '\n==> %s\n' "$*"; }
mkdir -p "$AIRFLOW_HOME"
: > "$LOG"
run_logged() {  # keep the noise in the log file; show its tail if the step fails
  if ! "$@" >>"$LOG" 2>&1; then echo "FAILED: $*  (last lines of $LOG:)" >&2; tail -n 40 "$LOG" >&2; exit 1; fi
}

step "Creating $VENV and installing airflow-provider-tao (first run: about a minute)"
[ -x "$VENV/bin/python" ] || run_logged "$PYTHON" -m venv "$VENV"
run_logged "$VENV/bin/pip" install -q -U pip
run_logged "$VENV/bin/pip" install -q -c "$ROOT/constraints.txt" -e "$ROOT"

step "Preparing the Airflow metadata database in $AIRFLOW_HOME"
run_logged "$VENV/bin/airflow" db migrate

step "Running the DAG tao_quickstart (prepare_data -> train on the local platform -> evaluate)"
run_logged "$VENV/bin/airflow" dags test tao_quickstart
grep -oE '\[job\] (Epoch|saved)[^[]*' "$LOG" | sed -E 's/^\[job\]/    training job:/; s/ +$//' || true
grep -oE 'job [0-9a-f]+: .*held-out MSE [0-9.]+' "$LOG" | sed 's/^/    evaluate task: /' || true

RESULTS=$(ls -dt "$AIRFLOW_HOME"/tao/results/*/ | head -n 1)
RESULTS=${RESULTS%/}
step "Done. Results of the training job: $RESULTS"
echo "    files:        $(cd "$RESULTS" && find . -type f | sort | sed 's|^./||' | tr '\n' ' ')"
echo "    metrics.json: $(cat "$RESULTS/metrics.json")"
echo "    job log:      $(ls -dt "$AIRFLOW_HOME"/tao/jobs/*/job.log | head -n 1)"
echo "    full output:  $LOG"
