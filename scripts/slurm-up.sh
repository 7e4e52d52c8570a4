#!/usr/bin/env bash
# slurm-up.sh - bring up a REAL single-machine SLURM cluster for the tao_slurm integration tests.
#
#   munge, MariaDB + slurmdbd (sacct; account `ci` with the CI user), slurmctld, two slurmd
#   (emulated nodes c1, c2 on this host, 2 CPUs each), Slurm's native OCI containers
#   (`--container=<bundle>` via rootless runc, busybox bundles built locally), and a key-only
#   sshd on 127.0.0.1 that the UNPRIVILEGED user `slurmci` logs into with an ed25519 key.
#   Writes $ROOT/env.sh with every connection fact the tests need (host key included).
#
# Debian 12, run as root, no systemd. Everything is installed from Debian packages here
# (apt-get update + install when a package is missing). Idempotent and safe to re-run while
# jobs run: config files are regenerated, a daemon is (re)started only when it is not running
# or its configuration changed. Concurrent callers are serialised with flock.
# Tear down with scripts/slurm-down.sh (same variables).
#
# Variables (all optional):
#   SLURM_CI_ROOT      root of the CI cluster files            (default /var/tmp/slurm-ci)
#                        shared/  results root ("shared filesystem"), owned by the CI user
#                        ssh/     client key pair + dedicated sshd host key + known_hosts
#                        oci/     OCI bundles for --container (busybox, python)
#                        env.sh   connection facts (source it)
#   SLURM_CI_USER      unprivileged login user                 (default slurmci)
#   SLURM_CI_SSH_PORT  sshd port on 127.0.0.1                  (default 2222)
#   SLURM_CI_CPUS      CPUs per emulated node                  (default 2)
#   SLURM_CI_MEM_MB    RealMemory per node                     (default 2048)
#   SLURM_CI_SKIP_APT  1 = never call apt-get (fail if a package is missing)   (default 0)
#   SLURM_CI_SMOKE     1 = after starting anything, submit one job over ssh    (default 1)
#   SLURM_CI_KEY_OWNER uid that may read the client private key (default $SUDO_UID or 0)
#
# Partitions: debug (default, MaxTime 4 h) | held (State=DOWN: PENDING, Reason=PartitionDown) |
#   short (MaxTime 1 min: TIMEOUT) | preempt (PriorityTier 1, PreemptMode=REQUEUE: victims) |
#   urgent (PriorityTier 10, MaxTime 30 min: preempts `preempt` jobs only, never debug/short).
#
# Behaviour measured on this cluster (Slurm 22.05.8; sacct -X State|ExitCode):
#   exit 3                          -> FAILED 3:0        killed by signal 9 -> FAILED 0:9
#   --output in a missing folder    -> FAILED 0:53 before the command runs; Slurm never creates it
#   TIMEOUT (short, --time=1)       -> TIMEOUT 0:0 after ~63 s (batch step CANCELLED 0:15, or
#                                      FAILED 15:0 if the script traps TERM); log line
#                                      "*** JOB n ON c1 CANCELLED AT ... DUE TO TIME LIMIT ***"
#   node down (`scontrol update nodename=c2 state=down reason=x`, as root, while the job runs):
#       without --requeue           -> NODE_FAIL 0:0 ("... DUE TO NODE FAILURE, SEE SLURMCTLD LOG ...")
#       with --requeue              -> requeued: PENDING (BeginTime) ~20 s, runs again with
#                                      SLURM_RESTART_COUNT=1; sacct -D shows NODE_FAIL then COMPLETED
#       (ReturnToService=2: the node is back to idle at once; EVERY job on it is hit)
#   preemption (job in `preempt`, then an `urgent` job needing its CPUs):
#       without --requeue           -> PREEMPTED 0:0 ("... DUE TO PREEMPTION ***")
#       with --requeue              -> requeued as above; sacct -D shows PREEMPTED then COMPLETED
#   scontrol requeue <id>           -> REQUEUED 0:0 then a new run (SLURM_RESTART_COUNT=1);
#                                      refused ("Requested operation is presently disabled") for a
#                                      job without --requeue, because JobRequeue=0
#   scancel of a PENDING job        -> sacct State "CANCELLED by <uid>" 0:0
#   --time above partition MaxTime  -> accepted, then PENDING (PartitionTimeLimit) forever
#   squeue -j <finished job>        -> prints nothing (add -t all; finished jobs stay 600 s)
#   sacct right after sbatch        -> a PENDING job is unknown to sacct for ~4-5 s
set -euo pipefail

SCRIPT=slurm-up
# shellcheck source=scripts/slurm-common.sh
. "$(dirname "$0")/slurm-common.sh"
SSH_PORT="${SLURM_CI_SSH_PORT:-2222}"
CPUS="${SLURM_CI_CPUS:-2}"
MEM_MB="${SLURM_CI_MEM_MB:-2048}"
SKIP_APT="${SLURM_CI_SKIP_APT:-0}"
SMOKE="${SLURM_CI_SMOKE:-1}"
KEY_OWNER="${SLURM_CI_KEY_OWNER:-${SUDO_UID:-0}}"

CLUSTER=ci
ACCOUNT=ci
NODES="c1 c2"
NODELIST="c[1-2]"
SLURMD_PORT_BASE=6830            # node cK listens on 6830+K


die() { echo "slurm-up: $*" >&2; exit 1; }

# one caller at a time (tests of several engineers may start it at once); fd 9 is closed for
# every daemon we start so the lock dies with this script
install -d -m 755 /run/lock
exec 9>"$LOCK"
flock -w 1800 9 || die "could not get $LOCK"

wait_for() {  # wait_for <seconds> <description> <command...>
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${secs}s waiting for $what"
    sleep 0.2
  done
}
# a pid file whose process is alive (see alive() in slurm-common.sh)
pid_alive() { [ -s "$1" ] && alive "$(cat "$1")"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# install_if_changed <src-tmpfile> <dest> <mode> [owner]: prints "changed" when dest was replaced
install_if_changed() {
  local src=$1 dst=$2 mode=$3 owner=${4:-root:root}
  if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
    chmod "$mode" "$dst"; chown "$owner" "$dst"; rm -f "$src"; return 0
  fi
  install -m "$mode" -o "${owner%%:*}" -g "${owner##*:}" "$src" "$dst"; rm -f "$src"; echo changed
}
STARTED=""   # daemons started/restarted by this run

# ------------------------------------------------------------------ 1. packages
PKGS="munge slurm-wlm slurmctld slurmd slurm-client slurmdbd mariadb-server mariadb-client
      openssh-server openssh-client runc busybox-static python3 util-linux"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  [ "$SKIP_APT" = 1 ] && die "missing packages:$missing (SLURM_CI_SKIP_APT=1)"
  T=$(date +%s%N)
  # package scripts must not start daemons with their default configs (CI images usually have
  # this already; add it only for the duration of the install if not)
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  ok=0
  for attempt in 1 2 3; do
    if apt-get -o DPkg::Lock::Timeout=900 -o Acquire::Retries=3 update -qq &&
       apt-get -o DPkg::Lock::Timeout=900 -o Acquire::Retries=3 install -y -qq --no-install-recommends \
         -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $missing >/dev/null; then
      ok=1; break
    fi
    log "apt attempt $attempt failed, retrying"; sleep 5
  done
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$ok" = 1 ] || die "apt-get install of$missing failed"
  log "apt-get update+install of$missing: $(ms_since "$T") ms"
else
  log "packages already installed"
fi
SLURM_VERSION=$(dpkg-query -W -f='${Version}' slurm-client | sed 's/-.*//')

# ------------------------------------------------------------------ 2. user, directories
if ! id "$CIUSER" >/dev/null 2>&1; then useradd -m -U -s /bin/bash "$CIUSER"; fi
usermod -p '*' "$CIUSER"   # no password, but not locked ('!' makes sshd refuse the key with UsePAM no)
CIHOME=$(getent passwd "$CIUSER" | cut -d: -f6)
CIUID=$(id -u "$CIUSER"); CIGID=$(id -g "$CIUSER")

install -d -m 755 "$ROOT" "$ROOT/oci"
install -d -m 750 -o "$KEY_OWNER" -g 0 "$ROOT/ssh"
install -d -m 2775 -o "$CIUID" -g "$CIGID" "$ROOT/shared"
runuser -u "$CIUSER" -- test -w "$ROOT/shared" || die "$CIUSER cannot write $ROOT/shared (a parent lacks o+x?)"
install -d -m 755 -o slurm -g slurm "$RUN" "$LOGDIR" "$SPOOL" "$SPOOL/ctld"
for n in $NODES; do install -d -m 755 "$SPOOL/d-$n"; done
install -d -m 755 /run/sshd
install -d -m 1777 /run/slurm-oci        # rootless runc state, one subdir per user

# ------------------------------------------------------------------ 3. munge
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  T=$(date +%s%N)
  runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID" </dev/null >>"$LOGDIR/munged.stdout" 2>&1 9>&-
  wait_for 20 munged bash -c 'munge -n | unmunge'
  STARTED="$STARTED munged"
  log "munged started ($(ms_since "$T") ms)"
fi

# ------------------------------------------------------------------ 4. slurm.conf, oci.conf (client tools such as sacctmgr need slurm.conf too)
tmp=$(mktemp)
{
cat <<EOF
# generated by airflow-provider-tao scripts/slurm-up.sh - single-host CI cluster
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=6817
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job must wait before it may start again (default 120 s)
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
# no systemd / cgroup delegation on this VM: track processes via /proc, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# preemption only between partitions 'preempt' (victims) and 'urgent' (preemptor); every other
# partition has PreemptMode=OFF. A victim with --requeue is requeued, without it ends PREEMPTED.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# batch jobs are NOT requeueable unless they ask for it (--requeue): makes NODE_FAIL observable
JobRequeue=0
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
# finished jobs stay visible to squeue -j / scontrol for 10 min, then only sacct knows them
MinJobAge=600
KillWait=2
OverTimeLimit=0
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageEnforce=associations
JobCompType=jobcomp/none
EOF
for n in $NODES; do
  k=${n#c}
  echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((SLURMD_PORT_BASE + k)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
done
cat <<EOF
PartitionName=debug   Nodes=$NODELIST Default=YES MaxTime=4:00:00 DefaultTime=1:00:00 State=UP PreemptMode=OFF
PartitionName=held    Nodes=$NODELIST MaxTime=4:00:00 DefaultTime=1:00:00 State=DOWN PreemptMode=OFF
PartitionName=short   Nodes=$NODELIST MaxTime=1 DefaultTime=1 State=UP PreemptMode=OFF
PartitionName=preempt Nodes=$NODELIST MaxTime=4:00:00 DefaultTime=1:00:00 State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=urgent  Nodes=$NODELIST MaxTime=30 DefaultTime=10 State=UP PriorityTier=10 PreemptMode=OFF
EOF
} > "$tmp"
conf_changed=$(install_if_changed "$tmp" /etc/slurm/slurm.conf 644)

# RunTimeQuery runs after `runc run` has already removed the container; plain `runc state` then
# prints a logfmt error that slurmstepd tries to parse as JSON and reports INTO THE JOB'S STDERR
# ("slurmstepd: error: _try_parse: JSON parsing error ... boolean expected"). The wrapper answers
# "{}" (= container gone) instead, so job logs stay clean.
tmp=$(mktemp)
cat > "$tmp" <<'EOF'
#!/bin/sh
# generated by airflow-provider-tao scripts/slurm-up.sh: runc-query <user> <container-id>
out=$(runc --rootless=true --root="/run/slurm-oci/$1" state "$2" 2>/dev/null) && [ -n "$out" ] &&
  { printf '%s\n' "$out"; exit 0; }
echo '{}'
EOF
install_if_changed "$tmp" /etc/slurm/runc-query 755 >/dev/null
tmp=$(mktemp)
cat > "$tmp" <<'EOF'
# generated by airflow-provider-tao scripts/slurm-up.sh
# Slurm-native OCI containers (sbatch/srun --container=<bundle dir>) via rootless runc
RunTimeQuery="/etc/slurm/runc-query %u %n.%u.%j.%s.%t"
RunTimeKill="runc --rootless=true --root=/run/slurm-oci/%u kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --rootless=true --root=/run/slurm-oci/%u delete --force %n.%u.%j.%s.%t"
RunTimeRun="runc --rootless=true --root=/run/slurm-oci/%u run %n.%u.%j.%s.%t -b %b"
EOF
oci_changed=$(install_if_changed "$tmp" /etc/slurm/oci.conf 644)

# ------------------------------------------------------------------ 5. MariaDB + slurmdbd
if ! mariadb-admin --socket="$MYSQL_SOCK" ping >/dev/null 2>&1; then
  T=$(date +%s%N)
  install -d -o mysql -g mysql -m 755 /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  # socket only (no TCP), small footprint; $MYSQL_PID marks "started by slurm-up"
  setsid /usr/sbin/mariadbd --user=mysql --skip-networking --socket="$MYSQL_SOCK" \
      --pid-file="$MYSQL_PID" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --performance-schema=OFF \
      --skip-log-bin </dev/null >>"$LOGDIR/mariadb.log" 2>&1 9>&- &
  wait_for 90 mariadb mariadb-admin --socket="$MYSQL_SOCK" ping
  STARTED="$STARTED mariadb"
  log "mariadb started ($(ms_since "$T") ms)"
fi
# slurmdbd runs as SlurmUser=slurm and logs in over the unix socket: no DB password anywhere
mariadb --socket="$MYSQL_SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

tmp=$(mktemp)
cat > "$tmp" <<EOF
# generated by airflow-provider-tao scripts/slurm-up.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
LogFile=$LOGDIR/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageLoc=slurm_acct_db
StorageUser=slurm
DebugLevel=info
EOF
dbd_changed=$(install_if_changed "$tmp" /etc/slurm/slurmdbd.conf 600 slurm:slurm)
if [ -n "$dbd_changed" ] || ! pid_alive "$RUN/slurmdbd.pid" || ! port_open 6819; then
  T=$(date +%s%N)
  stop_pidfile "$RUN/slurmdbd.pid"
  /usr/sbin/slurmdbd </dev/null >>"$LOGDIR/slurmdbd.stdout" 2>&1 9>&-
  wait_for 60 slurmdbd port_open 6819
  wait_for 60 "slurmdbd answering" sacctmgr -n list cluster
  STARTED="$STARTED slurmdbd"
  log "slurmdbd started ($(ms_since "$T") ms)"
fi
# associations BEFORE slurmctld starts (AccountingStorageEnforce=associations)
sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT" ||
  sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description="CI account" organization=ci >/dev/null
sacctmgr -n -P list assoc cluster="$CLUSTER" user="$CIUSER" account="$ACCOUNT" format=user | grep -qx "$CIUSER" ||
  sacctmgr -i add user "$CIUSER" account="$ACCOUNT" defaultaccount="$ACCOUNT" cluster="$CLUSTER" >/dev/null

# ------------------------------------------------------------------ 6. slurmctld + slurmd x2
nodes_ready() {  # every node registered and usable (not down / not still unknown)
  local st; st=$(sinfo -h -N -p debug -o '%N %T' | sort -u)
  [ "$(echo "$st" | grep -c -E ' (idle|mixed|allocated|completing)$')" -ge 2 ]
}
if [ -n "$conf_changed" ] || ! pid_alive "$RUN/slurmctld.pid"; then
  T=$(date +%s%N)
  stop_pidfile "$RUN/slurmctld.pid"
  /usr/sbin/slurmctld </dev/null >>"$LOGDIR/slurmctld.stdout" 2>&1 9>&-
  wait_for 60 slurmctld bash -c 'scontrol ping | grep -q UP'
  STARTED="$STARTED slurmctld"
  log "slurmctld started ($(ms_since "$T") ms)"
fi
for n in $NODES; do
  if [ -n "$conf_changed$oci_changed" ] || ! pid_alive "$RUN/slurmd-$n.pid"; then
    stop_pidfile "$RUN/slurmd-$n.pid"
    /usr/sbin/slurmd -N "$n" </dev/null >>"$LOGDIR/slurmd-$n.stdout" 2>&1 9>&-
    STARTED="$STARTED slurmd-$n"
  fi
done
T=$(date +%s%N)
wait_for 60 "2 usable nodes" nodes_ready
log "nodes ready ($(ms_since "$T") ms): $(sinfo -h -N -p debug -o '%N=%T' | sort -u | tr '\n' ' ')"

# ------------------------------------------------------------------ 7. key-only sshd (login node)
[ -s "$ROOT/ssh/ssh_host_ed25519_key" ] ||
  ssh-keygen -q -t ed25519 -N '' -C "slurm-ci-sshd" -f "$ROOT/ssh/ssh_host_ed25519_key"
chmod 600 "$ROOT/ssh/ssh_host_ed25519_key"; chown root:root "$ROOT/ssh/ssh_host_ed25519_key"
[ -s "$ROOT/ssh/id_ed25519" ] ||
  ssh-keygen -q -t ed25519 -N '' -C "$CIUSER@slurm-ci" -f "$ROOT/ssh/id_ed25519"
chown "$KEY_OWNER" "$ROOT/ssh/id_ed25519" "$ROOT/ssh/id_ed25519.pub"; chmod 600 "$ROOT/ssh/id_ed25519"
install -d -m 700 -o "$CIUID" -g "$CIGID" "$CIHOME/.ssh"
install -m 600 -o "$CIUID" -g "$CIGID" "$ROOT/ssh/id_ed25519.pub" "$CIHOME/.ssh/authorized_keys"
HOSTKEY=$(cut -d' ' -f1,2 "$ROOT/ssh/ssh_host_ed25519_key.pub")
# the ONE host key this sshd offers, recorded for clients (never ssh-keyscan: read it from disk)
echo "[127.0.0.1]:$SSH_PORT $HOSTKEY" > "$ROOT/ssh/known_hosts"; chmod 644 "$ROOT/ssh/known_hosts"

tmp=$(mktemp)
cat > "$tmp" <<EOF
# generated by airflow-provider-tao scripts/slurm-up.sh (separate instance; system sshd untouched)
Port $SSH_PORT
ListenAddress 127.0.0.1
# exactly one host key type, so every client negotiates the key recorded in env.sh
HostKey $ROOT/ssh/ssh_host_ed25519_key
PidFile $RUN/sshd.pid
AllowUsers $CIUSER
PermitRootLogin no
PubkeyAuthentication yes
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
AuthorizedKeysFile .ssh/authorized_keys
# like a typical login node: only locale variables are accepted from the client
AcceptEnv LANG LC_*
PrintMotd no
PrintLastLog no
# VERBOSE logs one "Accepted publickey for ..." line per connection (benchmarks count them)
LogLevel VERBOSE
# generous limits so a naive one-connection-per-job watcher is measured, not throttled
MaxStartups 256
MaxSessions 128
ClientAliveInterval 30
Subsystem sftp internal-sftp
EOF
sshd_changed=$(install_if_changed "$tmp" "$SSHD_CONF" 644)
/usr/sbin/sshd -t -f "$SSHD_CONF"
if [ -n "$sshd_changed" ] || ! pid_alive "$RUN/sshd.pid" || ! port_open "$SSH_PORT"; then
  T=$(date +%s%N)
  stop_pidfile "$RUN/sshd.pid"
  /usr/sbin/sshd -f "$SSHD_CONF" -E "$LOGDIR/sshd.log" </dev/null >/dev/null 2>&1 9>&-
  wait_for 20 sshd port_open "$SSH_PORT"
  STARTED="$STARTED sshd"
  log "sshd started on 127.0.0.1:$SSH_PORT ($(ms_since "$T") ms)"
fi

# ------------------------------------------------------------------ 8. OCI bundles
# busybox: rootfs = busybox-static only (the "no registry" image)
# python:  empty rootfs + the host's /usr bind-mounted read-only (/bin, /lib... are symlinks into
#          it), so python3 (the in-job runner) and the host's tools work inside the container
# Both bind-mount $ROOT/shared at the same path (read-write) so jobs can write results.
build_bundle() {  # build_bundle <dir> <with-host-usr 0|1>
  local b=$1 py=$2 d stamp="v1 uid=$CIUID gid=$CIGID root=$ROOT py=$2"
  [ -s "$b/config.json" ] && [ "$(cat "$b/.built" 2>/dev/null)" = "$stamp" ] && return 0
  rm -rf "$b"; install -d -m 755 "$b/rootfs"
  for d in proc sys dev etc root run var "${ROOT#/}/shared"; do install -d -m 755 "$b/rootfs/$d"; done
  install -d -m 1777 "$b/rootfs/tmp"    # slurmstepd bind-mounts job files under /tmp
  if [ "$py" = 1 ]; then
    install -d -m 755 "$b/rootfs/usr"
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$b/rootfs/$d"; done
  else
    install -d -m 755 "$b/rootfs/bin" "$b/rootfs/sbin" "$b/rootfs/usr/bin" "$b/rootfs/usr/sbin"
    cp /bin/busybox "$b/rootfs/bin/busybox"
    chroot "$b/rootfs" /bin/busybox --install -s
  fi
  printf 'root:x:0:0:root:/root:/bin/sh\n%s:x:%s:%s::/tmp:/bin/sh\n' "$CIUSER" "$CIUID" "$CIGID" > "$b/rootfs/etc/passwd"
  printf 'root:x:0:\n%s:x:%s:\n' "$CIUSER" "$CIGID" > "$b/rootfs/etc/group"
  printf 'NAME="slurm-ci-%s"\nID=slurm-ci\n' "$(basename "$b")" > "$b/rootfs/etc/os-release"
  chown "$CIUID:$CIGID" "$b"
  # rootless config: the uid/gid maps must name the submitting user's host ids -> generate AS that user
  (cd "$b" && runuser -u "$CIUSER" -- runc spec --rootless)
  /usr/bin/python3 - "$b/config.json" "$ROOT/shared" "$py" <<'PY'
import json, sys
path, shared, py = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cfg = json.load(open(path))
cfg["process"]["terminal"] = False
cfg["process"]["args"] = ["/bin/sh"]
env = [e for e in cfg["process"].get("env", []) if not e.startswith("PATH=")]
env.append("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
cfg["process"]["env"] = env
cfg["hostname"] = "oci-" + ("python" if py else "busybox")
mounts = cfg.setdefault("mounts", [])
mounts.append({"destination": shared, "type": "bind", "source": shared,
               "options": ["rbind", "rw", "nosuid", "nodev"]})
if py:
    mounts.append({"destination": "/usr", "type": "bind", "source": "/usr",
                   "options": ["rbind", "ro", "nosuid", "nodev"]})
json.dump(cfg, open(path, "w"), indent=2)
PY
  chown "$CIUID:$CIGID" "$b/config.json"
  echo "$stamp" > "$b/.built"
}
build_bundle "$ROOT/oci/busybox" 0
build_bundle "$ROOT/oci/python" 1

# ------------------------------------------------------------------ 9. env file
HOST=127.0.0.1
PYJSON=$(/usr/bin/python3 - "$HOST" "$SSH_PORT" "$CIUSER" "$ROOT/ssh/id_ed25519" "$HOSTKEY" "$ACCOUNT" "$ROOT/shared" <<'PY'
import json, sys
host, port, user, key, hostkey, account, results = sys.argv[1:8]
print(json.dumps({
    "conn_type": "tao_slurm", "host": host, "port": int(port), "login": user,
    "extra": {"key_file": key, "host_key": hostkey, "partition": "debug", "account": account,
              "results_root": results, "container_runtime": "oci", "cpus_per_task": 1,
              "gpus_per_node": 0, "time_hours": 1, "max_time_hours": 4},
}, separators=(",", ":")))
PY
)
tmp=$(mktemp)
cat > "$tmp" <<EOF
# generated by airflow-provider-tao scripts/slurm-up.sh - source me (bash/sh)
export SLURM_CI_ROOT='$ROOT'
export SLURM_CI_HOST='$HOST'
export SLURM_CI_PORT='$SSH_PORT'
export SLURM_CI_USER='$CIUSER'
export SLURM_CI_UID='$CIUID'
export SLURM_CI_KEY_FILE='$ROOT/ssh/id_ed25519'
export SLURM_CI_HOST_KEY='$HOSTKEY'
export SLURM_CI_KNOWN_HOSTS='$ROOT/ssh/known_hosts'
export SLURM_CI_RESULTS_ROOT='$ROOT/shared'
export SLURM_CI_ACCOUNT='$ACCOUNT'
export SLURM_CI_CLUSTER='$CLUSTER'
export SLURM_CI_PARTITION='debug'
export SLURM_CI_PARTITION_HELD='held'
export SLURM_CI_PARTITION_SHORT='short'
export SLURM_CI_PARTITION_PREEMPT='preempt'
export SLURM_CI_PARTITION_URGENT='urgent'
export SLURM_CI_NODES='c1,c2'
export SLURM_CI_CPUS_PER_NODE='$CPUS'
export SLURM_CI_OCI_BUNDLE='$ROOT/oci/busybox'
export SLURM_CI_OCI_BUNDLE_PY='$ROOT/oci/python'
export SLURM_CI_SLURM_VERSION='$SLURM_VERSION'
export SLURM_CI_LOG_DIR='$LOGDIR'
export SLURM_CI_SSHD_LOG='$LOGDIR/sshd.log'
export SLURM_CI_SSHD_CONFIG='$SSHD_CONF'
export SLURM_CI_PID_DIR='$RUN'
export AIRFLOW_CONN_TAO_SLURM_CI='$PYJSON'
EOF
install_if_changed "$tmp" "$ROOT/env.sh" 644 >/dev/null

# ------------------------------------------------------------------ 10. smoke test over real ssh
if [ "$SMOKE" = 1 ] && [ -n "$STARTED" ]; then
  T=$(date +%s%N)
  SSH=(ssh -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile="$ROOT/ssh/known_hosts"
       -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o LogLevel=ERROR
       -i "$ROOT/ssh/id_ed25519" -p "$SSH_PORT" "$CIUSER@$HOST")
  jid=$("${SSH[@]}" "sbatch --parsable -A $ACCOUNT -D '$ROOT/shared' -o /dev/null --wrap 'hostname; exit 0'")
  jid=${jid%%;*}
  wait_for 60 "sacct record of smoke job $jid" bash -c "sacct -X -n -P -j $jid -o State,ExitCode | grep -qx 'COMPLETED|0:0'"
  log "smoke job $jid over ssh: COMPLETED 0:0 ($(ms_since "$T") ms)"
fi
log "ready: Slurm $SLURM_VERSION, nodes c1,c2, ssh $CIUSER@$HOST:$SSH_PORT, started:${STARTED:- nothing (all up)}; env: $ROOT/env.sh"
