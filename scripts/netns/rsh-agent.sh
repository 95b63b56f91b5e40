#!/bin/sh
# Open MPI's remote-start agent (plm_rsh_agent) for "hosts" that are network namespaces of
# this machine: where mpirun would run `ssh HOST CMD`, this runs CMD in HOST's namespace,
# under its own host name (a UTS namespace), as sshd would on another machine.
#
# OXTRAIN_NETNS_HOSTS maps each host of the hostfile to its namespace, as
# "ADDR=NAMESPACE,ADDR=NAMESPACE"; mpirun passes its environment on to this agent.
# Usage (what mpirun calls): rsh-agent.sh [ssh-style options] HOST CMD...
set -eu
# mpirun may put ssh options (-x, -o ...) before the host; a namespace needs none of them.
while [ $# -gt 0 ]; do
  case "$1" in
    -o | -p | -l | -i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "rsh-agent.sh: usage: rsh-agent.sh HOST CMD..." >&2
  exit 2
fi
host=$1
shift
ns=""
for pair in $(echo "${OXTRAIN_NETNS_HOSTS:-}" | tr ',' ' '); do
  if [ "${pair%%=*}" = "$host" ]; then ns=${pair#*=}; fi
done
if [ -z "$ns" ]; then
  echo "rsh-agent.sh: host '$host' is not in OXTRAIN_NETNS_HOSTS='${OXTRAIN_NETNS_HOSTS:-}' (ADDR=NAMESPACE,...)" >&2
  exit 1
fi
# ssh hands the remote shell one string: the words joined by spaces.
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
