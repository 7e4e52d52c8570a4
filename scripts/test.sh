#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian machine with Python 3.11 and pip (run as root).
# Installs the Debian and Python packages the tests need, starts the backends they talk to (a private
# Docker engine, the SLURM cluster; moto S3 and `airflow standalone` are started by the test fixtures
# themselves), runs the linters and type checker, then pytest. Extra arguments go to pytest.
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
# procps/psmisc for process checks; the Docker engine's packages here, so docker-up.sh (run next to slurm-up.sh,
# which installs its own) never calls apt-get at the same time.
# chromium + a font for the browser test (Playwright drives /usr/bin/chromium; it never downloads a browser).
# postgresql: the e2e fixtures start a private server for the standalone instances' metadata databases.
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends procps psmisc \
  docker.io containerd runc iptables busybox-static debootstrap zstd chromium fonts-dejavu-core postgresql >/dev/null

step "Python packages into $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
"$VENV/bin/pip" install -q -c constraints.txt -e ".[test,all,docs]"
export PATH=$VENV/bin:$PATH

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

step "pytest"
set +e
python -m pytest -p no:cacheprovider -ra --durations=15 "$@"
rc=$?
set -e
step "pytest exit code $rc"
exit $rc
