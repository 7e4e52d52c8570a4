#!/usr/bin/env bash
# docker-up.sh - a PRIVATE Docker engine for the tao_docker integration tests, and the images they run.
#
#   Installs docker.io (+ iptables, containerd, runc, busybox-static, debootstrap, zstd) when missing, starts one
#   dockerd with its own socket, data root, exec root and pid file (never the machine's default daemon), listening
#   on a unix socket AND on tcp://127.0.0.1:$DOCKER_CI_TCP_PORT (the "remote daemon" path), with a stub
#   nvidia-container-runtime-hook on its PATH so GPU device requests work without a GPU (the stub records the
#   NVIDIA_VISIBLE_DEVICES it was asked for). No registry is reachable here: every image is built locally.
#     local/busybox:ci     busybox-static rootfs (plain commands, 0.1 s)
#     local/debian-py:ci   Debian bookworm minbase + python3 + boto3 + yaml (the in-job runner; ~40 s to build,
#                          cached as $ROOT/cache/debian-py.tar.zst)
#   Writes $ROOT/env.sh (DOCKER_CI_HOST, DOCKER_CI_TCP, DOCKER_CI_PID, images). Idempotent: ~0.1 s when up.
#   Concurrent callers are serialised with flock. Stop with scripts/docker-down.sh.
#
# Variables (all optional):
#   DOCKER_CI_ROOT      where the engine lives                    (default /var/tmp/docker-ci)
#   DOCKER_CI_TCP_PORT  loopback TCP port of the same daemon      (default 2376)
#   DOCKER_CI_SKIP_APT  1 = never call apt-get                    (default 0)
#
# dockerd config: overlay2, no iptables, no default bridge (host network only; "none" works too): see
# ../shared/notes/infra-fakes.md section 1 for what was measured. live-restore: containers keep running while
# dockerd restarts (what a production daemon should have; the restart test relies on it).
set -euo pipefail

ROOT="${DOCKER_CI_ROOT:-/var/tmp/docker-ci}"
TCP_PORT="${DOCKER_CI_TCP_PORT:-2376}"
SOCK="$ROOT/docker.sock"
PIDFILE="$ROOT/dockerd.pid"
LOCK=/run/lock/docker-ci.lock
T0=$(date +%s%N)
log() { printf '[docker-up %6sms] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))" "$*"; }
alive() { local st; st=$(sed -n 's/^.*) \([A-Za-z]\) .*$/\1/p' "/proc/$1/stat" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ]; }

[ "$(id -u)" = 0 ] || { echo "docker-up: must run as root" >&2; exit 1; }
mkdir -p "$ROOT" /run/lock
exec 9>"$LOCK"
flock 9

# ---------------------------------------------------------------------------------------------- packages
need=()
command -v dockerd >/dev/null || need+=(docker.io containerd runc)
command -v iptables >/dev/null || need+=(iptables)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v zstd >/dev/null || need+=(zstd)
if [ ${#need[@]} -gt 0 ]; then
  [ "${DOCKER_CI_SKIP_APT:-0}" = 1 ] && { echo "docker-up: missing packages: ${need[*]}" >&2; exit 1; }
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
DOCKER="docker -H unix://$SOCK"

# ---------------------------------------------------------------------------------------------- dockerd
mkdir -p "$ROOT/bin" "$ROOT/data" "$ROOT/exec" "$ROOT/cache"
cat > "$ROOT/bin/nvidia-container-runtime-hook" <<'EOF'
#!/bin/sh
# Stub: dockerd registers its NVIDIA device driver when this is on its PATH. Reads the OCI state, succeeds.
cat > /dev/null
exit 0
EOF
chmod 755 "$ROOT/bin/nvidia-container-runtime-hook"
cat > "$ROOT/daemon.json" <<EOF
{"storage-driver": "overlay2", "iptables": false, "ip-masq": false, "bridge": "none", "ip6tables": false,
 "live-restore": true, "hosts": ["unix://$SOCK", "tcp://127.0.0.1:$TCP_PORT"]}
EOF
if [ -s "$PIDFILE" ] && alive "$(cat "$PIDFILE")" && $DOCKER version >/dev/null 2>&1; then
  log "dockerd already running (pid $(cat "$PIDFILE"))"
else
  # The lock fd is not passed on: containerd-shims outlive dockerd (live-restore) and would hold it forever.
  rm -f "$PIDFILE" "$SOCK"
  PATH="$ROOT/bin:$PATH" setsid dockerd --config-file "$ROOT/daemon.json" --data-root "$ROOT/data" \
    --exec-root "$ROOT/exec" --pidfile "$PIDFILE" >>"$ROOT/dockerd.log" 2>&1 < /dev/null 9>&- &
  for _ in $(seq 1 150); do $DOCKER version >/dev/null 2>&1 && break; sleep 0.2; done
  $DOCKER version >/dev/null 2>&1 || { tail -30 "$ROOT/dockerd.log" >&2; echo "docker-up: dockerd did not start" >&2; exit 1; }
  log "dockerd started (pid $(cat "$PIDFILE"))"
fi

# ---------------------------------------------------------------------------------------------- images
if ! $DOCKER image inspect local/busybox:ci >/dev/null 2>&1; then
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs"/{bin,etc,tmp,proc,sys,dev,root,results}
  cp /bin/busybox "$rootfs/bin/"
  for applet in $("$rootfs/bin/busybox" --list); do [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  tar -C "$rootfs" -c . | $DOCKER import -c 'CMD ["/bin/sh"]' - local/busybox:ci >/dev/null
  rm -rf "$rootfs"
  log "built local/busybox:ci"
fi
if ! $DOCKER image inspect local/debian-py:ci >/dev/null 2>&1; then
  tarball="$ROOT/cache/debian-py.tar.zst"
  if [ ! -s "$tarball" ]; then
    rootfs=$(mktemp -d)
    debootstrap --variant=minbase --include=python3-minimal,python3-boto3,python3-yaml bookworm "$rootfs" \
      http://deb.debian.org/debian >"$ROOT/debootstrap.log" 2>&1 \
      || { tail -20 "$ROOT/debootstrap.log" >&2; echo "docker-up: debootstrap failed" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | zstd -q -3 -T0 -o "$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    log "debootstrapped Debian + python3 + boto3"
  fi
  zstd -q -d -c "$tarball" | $DOCKER import -c 'CMD ["/bin/bash"]' - local/debian-py:ci >/dev/null
  log "built local/debian-py:ci"
fi

cat > "$ROOT/env.sh" <<EOF
DOCKER_CI_HOST=unix://$SOCK
DOCKER_CI_TCP=tcp://127.0.0.1:$TCP_PORT
DOCKER_CI_PID=$(cat "$PIDFILE")
DOCKER_CI_BUSYBOX=local/busybox:ci
DOCKER_CI_PYTHON=local/debian-py:ci
EOF
log "ready: $(cat "$ROOT/env.sh" | tr '\n' ' ')"
