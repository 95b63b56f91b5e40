#!/usr/bin/env bash
# Times .ci/run on a clean clone of HEAD, as CI runs it, and prints a markdown block for
# docs/ci.md: the date, commit, machine, load average before and after, and the time of each
# step (.ci/run prints when each step starts).
#
#   scripts/ci_time.sh [LOG]     LOG defaults to a temporary file; the clone is removed after.
#
# The clone has no target/ (a cold build), but shares this user's cargo registry, pip venv
# (~/.cache/oxtrain-ci) and apt packages, as a CI machine with a warm package cache would.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
log="${1:-$(mktemp)}"
clone="$(mktemp -d)/oxtrain"
trap 'rm -rf "$(dirname "$clone")"' EXIT
git clone -q --no-hardlinks "$root" "$clone"
commit="$(git -C "$clone" rev-parse --short HEAD)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
set +e
(cd "$clone" && .ci/run) >"$log" 2>&1
status=$?
set -e
total=$(($(date +%s) - start))
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"

echo "### $(date -u +%F) at $commit: $((total / 60)) min $((total % 60)) s, exit $status"
echo
echo "$(nproc) cores ($cpu), $(free -g | awk '/^Mem:/{print $2}') GiB; load average (1, 5, 15 min)"
echo "before: $load_before, after: $load_after."
echo
echo "| step | starts at | takes |"
echo "| --- | ---: | ---: |"
# Lines like "== [+123s] cargo clippy -D warnings"; the last one is ".ci/run ends (exit N)".
grep -E '^== \[\+[0-9]+s\] ' "$log" | sed -E 's/^== \[\+([0-9]+)s\] (.*)$/\1\t\2/' |
  awk -F'\t' -v total="$total" '
    NR > 1 { printf "| %s | %d s | %d s |\n", name, at, $1 - at }
    { at = $1; name = $2 }
    END { if (name !~ /ends/) printf "| %s | %d s | %d s |\n", name, at, total - at }'
exit "$status"
