# Shared by slurm-up.sh and slurm-down.sh (sourced, not run): where the CI cluster lives, and small helpers.
# The caller sets SCRIPT (its name, for messages) before sourcing.
ROOT="${SLURM_CI_ROOT:-/var/tmp/slurm-ci}"
CIUSER="${SLURM_CI_USER:-slurmci}"
RUN=/run/slurm-ci                # pid files + markers of what slurm-up started
LOGDIR=/var/log/slurm-ci
SPOOL=/var/spool/slurm-ci
SSHD_CONF=/etc/ssh/sshd_config_slurm_ci
MYSQL_SOCK=/run/mysqld/mysqld.sock
# daemons that drop to their own user keep their pid file in their own run dir
MUNGE_PID=/run/munge/munged-slurm-ci.pid
MYSQL_PID=/run/mysqld/mariadbd-slurm-ci.pid
LOCK=/run/lock/slurm-ci.lock

[ "$(id -u)" = 0 ] || { echo "$SCRIPT: must run as root" >&2; exit 1; }
case "$ROOT" in /*) ;; *) echo "$SCRIPT: SLURM_CI_ROOT must be absolute" >&2; exit 1;; esac

T_START=$(date +%s%N)
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log() { printf '[%s %6sms] %s\n' "$SCRIPT" "$(ms_since "$T_START")" "$*"; }
# alive PID: exists and is not a zombie (PID 1 in some sandboxes never reaps, so kill -0 lies)
alive() { local st; st=$(sed -n 's/^.*) \([A-Za-z]\) .*$/\1/p' "/proc/$1/stat" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
stop_pidfile() {  # TERM only the PID named in the file, wait, then KILL
  local f=$1 secs=${2:-20} pid
  [ -s "$f" ] || { rm -f "$f"; return 0; }
  pid=$(cat "$f")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((secs * 5))); do alive "$pid" || break; sleep 0.2; done
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; log "killed -9 $f ($pid)"; fi
    log "stopped $(basename "$f" .pid) ($pid)"
  fi
  rm -f "$f"
}
