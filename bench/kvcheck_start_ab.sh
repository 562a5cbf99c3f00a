#!/bin/bash
# One kvcheck start, side by side: kvcheck-core (A: libtorch loaded, as
# every start was before the torch-free front) against kvcheck (B: the
# front, which answers help and usage errors itself and execs kvcheck-core
# for the rest), alternating A and B ROUNDS times per command, with
# /usr/bin/time (user+sys includes the waited children). One line per
# command and side: mean wall, mean and least CPU.
#
#   bench/kvcheck_start_ab.sh build/default/bin 5
#   ASAN_OPTIONS=detect_leaks=0 bench/kvcheck_start_ab.sh build/fuzz/bin 5
set -euo pipefail
bin=$(realpath "$1") rounds=${2:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
commands=("--help" "run --cases 0" "--version" "run --adapter reference --cases 5 --quiet --trace-dir .")
for command in "${commands[@]}"; do
    : > A.time
    : > B.time
    for _ in $(seq "$rounds"); do
        for which in A B; do
            exe=$bin/kvcheck
            [ $which = A ] && exe=$bin/kvcheck-core
            # shellcheck disable=SC2086  # the command's words
            /usr/bin/time -f "%e %U %S" -a -o $which.time "$exe" $command > /dev/null 2>&1 || true
        done
    done
    for which in A B; do
        grep -v '^Command' $which.time | awk -v c="$command" -v w=$which '
            {n++; wall += $1; cpu = $2 + $3; sum += cpu; if (n == 1 || cpu < least) least = cpu}
            END {printf "%-58s %s wall %.3f s  CPU %.3f s (least %.3f)  n=%d\n", c, w, wall / n, sum / n, least, n}'
    done
done
echo "load (1, 5, 15 min): $(cut -d' ' -f1-3 /proc/loadavg)"
