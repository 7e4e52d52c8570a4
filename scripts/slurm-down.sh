#!/usr/bin/env bash
# slurm-down.sh - stop everything scripts/slurm-up.sh started (by its PID files only, never by
# process name) and remove the cluster state it created, so the next slurm-up.sh starts clean
# (job ids from 1, empty accounting DB, new keys). Debian packages are kept.
# Idempotent; safe when nothing is running. Run as root.
#
# Variables (all optional, same meaning as in slurm-up.sh):
#   SLURM_CI_ROOT        (default /var/tmp/slurm-ci) - removed unless SLURM_CI_KEEP_STATE=1
#   SLURM_CI_USER        (default slurmci)
#   SLURM_CI_KEEP_STATE  1 = only stop the daemons; keep spool, DB, logs, keys, configs (default 0)
#   SLURM_CI_PURGE_USER  1 = also delete the CI user and its home                    (default 0)
set -uo pipefail

SCRIPT=slurm-down
# shellcheck source=scripts/slurm-common.sh
. "$(dirname "$0")/slurm-common.sh"
KEEP="${SLURM_CI_KEEP_STATE:-0}"
PURGE_USER="${SLURM_CI_PURGE_USER:-0}"


install -d -m 755 /run/lock
exec 9>"$LOCK"
flock -w 600 9 || { echo "slurm-down: could not get $LOCK" >&2; exit 1; }

# 1. let Slurm end every job itself (slurmd/slurmstepd kill the job steps and OCI containers)
if [ -s "$RUN/slurmctld.pid" ] && alive "$(cat "$RUN/slurmctld.pid")"; then
  ids=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    log "cancelling jobs: $ids"
    scancel $ids 2>/dev/null || true
    for _ in $(seq 1 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# 2. daemons, reverse start order
stop_pidfile "$RUN/sshd.pid"
for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
stop_pidfile "$RUN/slurmctld.pid"
stop_pidfile "$RUN/slurmdbd.pid"
if [ "$KEEP" != 1 ] && [ -S "$MYSQL_SOCK" ]; then
  mariadb --socket="$MYSQL_SOCK" -e "DROP DATABASE IF EXISTS slurm_acct_db; DROP USER IF EXISTS 'slurm'@'localhost';" 2>/dev/null &&
    log "dropped slurm_acct_db"
fi
stop_pidfile "$MYSQL_PID" 60   # only a mariadbd that slurm-up.sh started
stop_pidfile "$MUNGE_PID"      # only a munged that slurm-up.sh started

# 3. job processes left behind by the CI user (only if slurmd died under them): by PID
if id "$CIUSER" >/dev/null 2>&1; then
  uid=$(id -u "$CIUSER"); left=""
  for d in /proc/[0-9]*; do
    [ "$(stat -c %u "$d" 2>/dev/null)" = "$uid" ] && left="$left ${d#/proc/}"
  done
  if [ -n "$left" ]; then
    log "terminating leftover $CIUSER processes:$left"
    kill -TERM $left 2>/dev/null || true; sleep 1
    for p in $left; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
  fi
fi

# 4. state
if [ "$KEEP" != 1 ]; then
  rm -rf "$SPOOL" "$LOGDIR" "$RUN" /run/slurm-oci
  rm -f /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf /etc/slurm/oci.conf /etc/slurm/runc-query "$SSHD_CONF"
  case "$ROOT" in /|/etc|/var|/usr|/home|/root|/tmp|/var/tmp|"") echo "slurm-down: refusing to remove $ROOT" >&2;;
    *) rm -rf "$ROOT";; esac
  if id "$CIUSER" >/dev/null 2>&1; then
    h=$(getent passwd "$CIUSER" | cut -d: -f6); rm -f "$h/.ssh/authorized_keys"
  fi
  log "state removed (spool, logs, configs, $ROOT)"
fi
if [ "$PURGE_USER" = 1 ] && id "$CIUSER" >/dev/null 2>&1; then
  userdel -r "$CIUSER" 2>/dev/null || true; log "user $CIUSER removed"
fi
rm -f "$LOCK"
log "done"
