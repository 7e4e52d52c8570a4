#!/usr/bin/env bash
# docker-down.sh - stop the private Docker engine scripts/docker-up.sh started: its containers labelled
# tao.nvidia.com/managed=true are removed, then dockerd is stopped by its PID file (never by process name). The data
# root (images, the built-image cache) is kept, so the next docker-up.sh starts in seconds.
# Idempotent; safe when nothing is running. Run as root.
#
# Variables (optional, same meaning as in docker-up.sh): DOCKER_CI_ROOT (default /var/tmp/docker-ci)
set -uo pipefail

ROOT="${DOCKER_CI_ROOT:-/var/tmp/docker-ci}"
PIDFILE="$ROOT/dockerd.pid"
DOCKER="docker -H unix://$ROOT/docker.sock"

[ -s "$PIDFILE" ] || { echo "docker-down: no dockerd running from $ROOT"; exit 0; }
pid=$(cat "$PIDFILE")
if [ -d "/proc/$pid" ]; then
  ids=$($DOCKER ps -aq --filter label=tao.nvidia.com/managed=true 2>/dev/null)
  [ -z "$ids" ] || $DOCKER rm -f $ids >/dev/null 2>&1
  kill "$pid"
  for _ in $(seq 1 150); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
  [ -d "/proc/$pid" ] && { echo "docker-down: dockerd $pid did not stop; killing it" >&2; kill -9 "$pid"; }
fi
rm -f "$PIDFILE"
echo "docker-down: dockerd stopped"
