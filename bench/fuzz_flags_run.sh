#!/usr/bin/env bash
# What SanitizerCoverage (-fsanitize=fuzzer-no-link) costs the programs CI's
# sanitizer stage runs: the same commands on two clang-14 ASan + UBSan builds,
# with (fuzz-search preset) and without (fuzz preset) the instrumentation,
# alternating, ROUNDS times; CPU (user + sys) and wall of each, and the load.
#   bench/fuzz_flags_run.sh [ROUNDS] [WITH_BUILD] [WITHOUT_BUILD]
# Defaults: 2 rounds, build/fuzz-search and build/fuzz. A command whose
# program (kvcheck, kv_unit_tests, kv_mutant_tests, fuzz_ops) is not built
# in both is skipped, and said so.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
with=$(realpath "${2:-build/fuzz-search}")
without=$(realpath "${3:-build/fuzz}")
repo=$PWD
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-fuzz-flags-run.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# name|command, with B for the build folder and R for the repository;
# each runs in a scratch folder, removed after
cases=(
  "kvcheck --help|B/bin/kvcheck --help"
  "kvcheck run reference 200 cases|B/bin/kvcheck run --adapter reference --cases 200 --seed 1"
  "kv_unit_tests Trace*:Workload*|B/tests/kv_unit_tests --gtest_filter=Trace*:Workload*"
  "kv_mutant_tests Domain.*|B/properties/kv_mutant_tests --gtest_filter=Domain.*"
  "replay corpus ops|R/fuzz/replay corpus B/fuzz/fuzz_ops R/corpus/ops"
)
for entry in "${cases[@]}"; do
  name=${entry%%|*}
  program=$(grep -o 'B/[^ ]*' <<<"${entry#*|}" | head -n 1)  # the first program of the build
  if [[ ! -x ${program/B\//$with/} || ! -x ${program/B\//$without/} ]]; then
    echo "$name | skipped: ${program#B/} is not built in both"
    continue
  fi
  for ((round = 1; round <= rounds; round++)); do
    for variant in with without; do
      build=${!variant}
      command=${entry#*|}
      command=${command//B\//$build/}
      command=${command//R\//$repo/}
      load=$(cut -d' ' -f1 /proc/loadavg)
      (cd "$scratch" && /usr/bin/time -f "%e %U %S" -o "$scratch/time" bash -c "$command" \
        >"$scratch/out" 2>&1) || { tail -20 "$scratch/out"; echo "fuzz_flags_run: failed: $command" >&2; exit 1; }
      read -r wall user sys <"$scratch/time"
      printf '%s | %s | round %d | cpu %.2f s (user %s sys %s) | wall %s | load %s\n' "$name" "$variant" "$round" \
        "$(echo "$user + $sys" | bc)" "$user" "$sys" "$wall" "$load"
    done
  done
done
