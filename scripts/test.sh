#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian machine with Python 3.11 and pip (run as root).
# Installs the Debian and Python packages the tests need, starts the backends they talk to (a private
# Docker engine, the SLURM cluster; moto S3 and `airflow standalone` are started by the test fixtures
# themselves), runs the linters and type checker, then pytest (TAO_TEST_WORKERS lanes at once, 2 by default; 0 = one
# process); meanwhile, in the background, the unit tests and the
# quickstart on Python 3.12 (PYTHON312, else pyenv's, else python3.12 on PATH; none is an error). Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
# Python 3.12 for the second run: PYTHON312, else pyenv's (its shim on PATH fails unless 3.12 is selected), else PATH's
find_python312() {
  local candidate
  for candidate in "${PYTHON312:-}" $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | sort -rV) \
      "$(command -v python3.12 || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}
PYTHON312=$(find_python312)
VENV=$ROOT/.venv
VENV312=$ROOT/.venv-py312
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

step "Debian packages"
apt-get -o DPkg::Lock::Timeout=600 update -qq
# procps/psmisc for process checks; the Docker engine's packages here, so docker-up.sh (run next to slurm-up.sh,
# which installs its own) never calls apt-get at the same time.
# chromium + a font for the browser test (Playwright drives /usr/bin/chromium; it never downloads a browser).
# postgresql: the e2e fixtures start a private server for the standalone instances' metadata databases.
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends procps psmisc \
  docker.io containerd runc iptables busybox-static debootstrap zstd chromium fonts-dejavu-core postgresql >/dev/null

step "Python packages into $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip >= 25.1 installs the dependency groups (pyproject.toml [dependency-groups]: test, docs), never published
"$VENV/bin/pip" install -q -U "pip>=25.1"
"$VENV/bin/pip" install -q -c constraints.txt -e ".[all]" --group test --group docs
export PATH=$VENV/bin:$PATH

step "Python 3.12: its venv, then its unit tests and the quickstart (in the background, at the lowest priority)"
# Built and run while the 3.11 suite runs: mostly downloads, then CPU the main suite leaves idle (its end-to-end tests
# wait on Airflow most of the time); nice 19 keeps it out of the main suite's way. Reported after the main suite.
PY312_LOG=/tmp/python312-run.log
MAIN_DONE=$(mktemp -u /tmp/tao-main-suite-done.XXXXXX)  # made once the main suite ends
if [ -n "$PYTHON312" ]; then
  (
    set +e
    {
      [ -x "$VENV312/bin/python" ] || "$PYTHON312" -m venv "$VENV312"
      "$VENV312/bin/pip" install -q -U "pip>=25.1" &&
        "$VENV312/bin/pip" install -q -c constraints.txt -e ".[all]" --group test
    } > /tmp/venv-py312.log 2>&1 || { echo "the Python 3.12 venv could not be built:"; tail -40 /tmp/venv-py312.log; exit 3; }
    "$PYTHON312" --version
    # what it starts from here inherits nice 19, until the main suite ends (below)
    [ -e "$MAIN_DONE" ] || renice -n 19 -p "$BASHPID" >/dev/null
    "$VENV312/bin/python" -m pytest -p no:cacheprovider -q tests/unit
    rc312=$?
    # the README's quickstart with 3.12, in the venv above (the script installs the provider into it as a user would)
    VENV=$VENV312 PYTHON=$PYTHON312 QUICKSTART_DIR=$ROOT/.quickstart-py312 bash scripts/quickstart.sh
    rc_quickstart=$?
    echo "Python 3.12: unit tests exit code $rc312, quickstart exit code $rc_quickstart"
    [ "$rc312" -eq 0 ] && [ "$rc_quickstart" -eq 0 ]
  ) > "$PY312_LOG" 2>&1 &
  py312=$!
else
  py312=
fi

step "backends: a private Docker engine and its images, the SLURM cluster (in parallel)"
# The fixtures call these again (a no-op once up); starting them here keeps a cold install out of any test's timeout.
# The Docker engine is private to this run: stopped (by pid) when the script ends, whatever happened.
trap 'bash scripts/docker-down.sh' EXIT
DOCKER_CI_SKIP_APT=1 bash scripts/docker-up.sh > /tmp/docker-up.log 2>&1 &
docker_up=$!
bash scripts/slurm-up.sh > /tmp/slurm-up.log 2>&1 || { tail -40 /tmp/slurm-up.log; exit 1; }
wait "$docker_up" || { tail -40 /tmp/docker-up.log; exit 1; }
tail -1 /tmp/docker-up.log

step "ruff, mypy"
ruff check .
ruff format --check .
mypy airflow_provider_tao

step "docs (Sphinx, warnings are errors)"
python -m sphinx -W --keep-going -q -b html docs build/docs

step "pytest (TAO_TEST_WORKERS=${TAO_TEST_WORKERS:=2} lanes side by side, tests/lanes.py; 0: one process)"
# Two lanes: the end-to-end folders, the explorer and each backend's integration tests wait on Airflow and on jobs
# most of the time, so two of them fit two cores (measured: ~27 min against ~41 in one process; 3 lanes loaded the
# machine past what its timing-bound tests held, docs/reliability.md "The suite on a busy machine").
set +e
python -m pytest -p no:cacheprovider -ra --durations=15 -n "$TAO_TEST_WORKERS" "$@"
rc=$?
set -e
step "pytest exit code $rc"

step "Python 3.12: the unit tests and the quickstart (run in the background meanwhile)"
if [ -z "$py312" ]; then
  echo "No Python 3.12 here (neither python3.12 on PATH nor one in pyenv): the 3.12 run cannot be made" >&2
  exit 1
fi
# The main suite is done: the 3.12 run's nice 19 kept it out of its way and now only slows it (on a busy machine it
# starved: its quickstart took 15 minutes after pytest). Its processes, and those they start, go back to nice 0.
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
touch "$MAIN_DONE"
renice -n 0 -p "$py312" $(descendants "$py312") >/dev/null 2>&1 || true
set +e
wait "$py312"
rc312=$?
set -e
rm -f "$MAIN_DONE"
cat "$PY312_LOG"
step "pytest exit code $rc; Python 3.12 run exit code $rc312"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$rc312"
