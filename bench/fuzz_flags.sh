#!/usr/bin/env bash
# What SanitizerCoverage (-fsanitize=fuzzer-no-link) costs CI's clang-14
# ASan + UBSan stage, side by side: with it (fuzz-search preset) and without
# (fuzz preset), alternating, ROUNDS times each; CPU (user + sys), wall and
# the load of every measurement (BENCHMARKS.md, "The fuzz stage without
# coverage instrumentation").
#   bench/fuzz_flags.sh run [ROUNDS] [WITH_BUILD] [WITHOUT_BUILD]
#     the programs the stage runs, on the two builds (defaults: 2 rounds,
#     build/fuzz-search and build/fuzz); a command whose program (kvcheck,
#     kv_unit_tests, kv_mutant_tests, fuzz_ops) is not built in both is
#     skipped, and said so; each runs in a scratch folder, removed after;
#     FUZZ_FLAGS_CASES=REGEX runs only the commands whose name matches
#   bench/fuzz_flags.sh compile [ROUNDS] [SOURCE...]
#     sources (relative to the repo) compiled with their exact command from
#     build/fuzz-search/compile_commands.json (`cmake --preset fuzz-search`,
#     configure only) without the precompiled header, so both variants parse
#     the same headers; ccache off
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mode=${1:?usage: bench/fuzz_flags.sh run|compile [ROUNDS] ...}
rounds=${2:-2}
shift 2 || shift $#
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-fuzz-flags.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

timed() {  # LABEL DIR COMMAND: runs COMMAND in DIR, prints its CPU, wall and the load before
  local label=$1 dir=$2 command=$3 load wall user sys
  load=$(cut -d' ' -f1 /proc/loadavg)
  (cd "$dir" && /usr/bin/time -f "%e %U %S" -o "$scratch/time" bash -c "$command" >"$scratch/out" 2>&1) \
    || { tail -20 "$scratch/out"; echo "fuzz_flags: failed: $command" >&2; exit 1; }
  read -r wall user sys <"$scratch/time"
  printf '%s | cpu %.2f s (user %s sys %s) | wall %s | load %s\n' "$label" "$(echo "$user + $sys" | bc)" \
    "$user" "$sys" "$wall" "$load"
}

run() {
  local with without entry name program command build variant round
  with=$(realpath "${1:-build/fuzz-search}")
  without=$(realpath "${2:-build/fuzz}")
  export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # name|command, with B for the build folder and R for the repository
  local cases=(
    "kvcheck --help|B/bin/kvcheck --help"
    "kvcheck run reference 200 cases|B/bin/kvcheck run --adapter reference --cases 200 --seed 1"
    "kv_unit_tests Trace*:Workload*|B/tests/kv_unit_tests --gtest_filter=Trace*:Workload*"
    "kv_mutant_tests Domain.*|B/properties/kv_mutant_tests --gtest_filter=Domain.*"
    "replay corpus ops|R/fuzz/replay corpus B/fuzz/fuzz_ops R/corpus/ops"
  )
  for entry in "${cases[@]}"; do
    name=${entry%%|*}
    [[ $name =~ ${FUZZ_FLAGS_CASES:-.} ]] || continue
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
        timed "$name | $variant | round $round" "$scratch" "$command"
      done
    done
  done
}

compile() {
  local db=build/fuzz-search/compile_commands.json sources=("$@") source command dir cmd c round variant
  ((${#sources[@]})) || sources=(harness/workload.cpp harness/checkers/no_leak.cpp tests/workload_test.cpp
    adapters/faulty/faulty_engine.cpp adapters/mutants/mutants.cpp src/paged_pool.cpp fuzz/trace_target.cpp)
  [[ -f $db ]] || { echo "fuzz_flags: $db missing: run cmake --preset fuzz-search" >&2; exit 1; }
  export CCACHE_DISABLE=1
  for source in "${sources[@]}"; do
    command=$(python3 - "$db" "$repo/$source" "$scratch/o.o" <<'EOF'
import json, shlex, sys
db, source, obj = sys.argv[1:]
entry = next(e for e in json.load(open(db)) if e["file"] == source)
args = shlex.split(entry["command"])
kept, skip = [], 0
for i, a in enumerate(args):
    if skip:
        skip -= 1
        continue
    if a == "-Winvalid-pch":
        continue
    if a == "-Xclang" and i + 1 < len(args) and args[i + 1] in ("-include-pch", "-include"):
        skip = 3  # -include-pch -Xclang FILE
        continue
    if a == "-o":
        kept += ["-o", obj]
        skip = 1
        continue
    kept.append(a)
print(entry["directory"])
print(shlex.join(kept))
EOF
)
    dir=${command%%$'\n'*}
    cmd=${command#*$'\n'}
    for ((round = 1; round <= rounds; round++)); do
      for variant in with without; do
        c=$cmd
        [[ $variant == without ]] && c=${c//-fsanitize=fuzzer-no-link /}
        timed "$source | $variant | round $round" "$dir" "$c"
      done
    done
  done
}

case $mode in
  run) run "$@" ;;
  compile) compile "$@" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
