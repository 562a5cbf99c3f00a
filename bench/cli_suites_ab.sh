#!/bin/bash
# The cli ctest suites side by side: each suite's gtest filter (as ctest
# runs it) on binary A, then on binary B, one after the other, with
# /usr/bin/time (user+sys includes every waited child) and the count of
# kvcheck starts (KVCHECK_CLI_TEST_LOG, tests/cli_util.cpp). One line per
# run on standard output; the logs under $OUT (default a mktemp dir).
#
#   bench/cli_suites_ab.sh BUILD_DIR A_BINARY B_BINARY [SUITE ...]
#   bench/cli_suites_ab.sh build/default /tmp/kv_cli_tests.main build/default/tests/kv_cli_tests faults replays
#
# A and B must be kv_cli_tests binaries of BUILD_DIR (they run its kvcheck).
# Under an ASan build, set ASAN_OPTIONS=detect_leaks=0 as CI's preset does.
#
# A_KVCHECK=core: A runs with BUILD_DIR/bin/kvcheck a symbolic link to
# kvcheck-core (every start loads libtorch, as before the torch-free front),
# B with the front as built; give the same binary as A and B:
#   A_KVCHECK=core bench/cli_suites_ab.sh build/default build/default/tests/kv_cli_tests build/default/tests/kv_cli_tests
set -euo pipefail
build=$1 a=$(realpath "$2") b=$(realpath "$3")
bin=$(realpath "$build")/bin
front_aside() {
    [ "${A_KVCHECK:-}" = core ] || return 0
    mv "$bin/kvcheck" "$bin/kvcheck.front" && ln -s kvcheck-core "$bin/kvcheck"
    trap front_back EXIT
}
front_back() {
    [ -e "$bin/kvcheck.front" ] || return 0
    rm -f "$bin/kvcheck" && mv "$bin/kvcheck.front" "$bin/kvcheck"
}
shift 3
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(faults replays hostile runs kvcheck)
out=${OUT:-$(mktemp -d)}
for suite in "${suites[@]}"; do
    filter=$(/usr/bin/ctest --test-dir "$build" -N -V -R "^cli\.$suite\$" | sed -n 's/.*Test command: .*"--gtest_filter=\(.*\)"$/\1/p')
    [ -n "$filter" ] || { echo "no ctest test cli.$suite in $build" >&2; exit 2; }
    for which in A B; do
        binary=$a
        [ $which = B ] && binary=$b
        if [ $which = A ]; then front_aside; else front_back; fi
        load=$(cut -d' ' -f1 /proc/loadavg)
        log=$out/$suite-$which.log
        rm -f "$log"
        status=0
        (cd "$out" && KVCHECK_CLI_TEST_LOG=$log /usr/bin/time -f "%e %U %S" -o "$out/time" "$binary" "--gtest_filter=$filter" \
            > "$out/$suite-$which.out" 2>&1) || status=$?
        read -r wall user sys < <(tail -1 "$out/time")
        echo "cli.$suite $which exit=$status load=$load starts=$(cat "$log" 2>/dev/null | wc -l) wall=$wall user=$user sys=$sys"
    done
done
