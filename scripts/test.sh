#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian machine with Python 3.11 and pip (run as root).
# Installs the Debian and Python packages the tests need, starts the backends they talk to
# (moto S3 and `airflow standalone` are started by the test fixtures themselves), runs the
# linters and type checker, then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=$ROOT/.venv
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

step "Debian packages"
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends procps psmisc >/dev/null

step "Python packages into $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
"$VENV/bin/pip" install -q -c constraints.txt -e ".[test,all]"
export PATH=$VENV/bin:$PATH

step "ruff, mypy"
ruff check .
ruff format --check .
mypy airflow_provider_tao

step "pytest"
set +e
python -m pytest -p no:cacheprovider -ra --durations=15 "$@"
rc=$?
set -e
step "pytest exit code $rc"
exit $rc
