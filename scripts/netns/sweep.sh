#!/bin/sh
# Removes the network namespaces that comm's namespace tests (comm/tests/netns.rs) left behind
# when they were killed before their cleanup ran: every `oxtnet-<pid>-...` whose test process
# <pid> is gone (with --all: every `oxtnet-...`, for when no test is running). The processes
# still running inside them are ended first. The tests do this themselves at start; this is
# the same by hand. Needs root.
set -eu
all=0
[ "${1:-}" = "--all" ] && all=1
ip netns list | while read -r ns _; do
  case "$ns" in oxtnet-*) ;; *) continue ;; esac
  pid=${ns#oxtnet-}
  pid=${pid%%-*}
  if [ "$all" = 1 ] || [ ! -d "/proc/$pid" ]; then
    for p in $(ip netns pids "$ns"); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" && echo "removed $ns"
  fi
done
