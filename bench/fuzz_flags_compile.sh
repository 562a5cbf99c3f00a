#!/usr/bin/env bash
# What SanitizerCoverage (-fsanitize=fuzzer-no-link) costs a compile under
# the fuzz-search preset's flags (clang-14, ASan + UBSan, -O2), source by
# source: each source's exact command from build/fuzz-search's
# compile_commands.json, without the precompiled header (so both variants
# parse the same headers), compiled ROUNDS times with and without the flag,
# alternating, ccache off; CPU (user + sys) and wall of each compile.
#   bench/fuzz_flags_compile.sh [ROUNDS] [SOURCE...]   (sources relative to the repo)
# Needs `cmake --preset fuzz-search` (configure only).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
sources=("$@")
((${#sources[@]})) || sources=(harness/workload.cpp harness/checkers/no_leak.cpp tests/workload_test.cpp
  adapters/faulty/faulty_engine.cpp adapters/mutants/mutants.cpp src/paged_pool.cpp fuzz/trace_target.cpp)
db=build/fuzz-search/compile_commands.json
[[ -f $db ]] || { echo "fuzz_flags_compile: $db missing: run cmake --preset fuzz-search" >&2; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-fuzz-flags.XXXXXX")
trap 'rm -rf "$out"' EXIT
export CCACHE_DISABLE=1
for source in "${sources[@]}"; do
  command=$(python3 - "$db" "$PWD/$source" "$out/o.o" <<'EOF'
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
      (cd "$dir" && /usr/bin/time -f "%e %U %S" -o "$out/time" bash -c "$c")
      read -r wall user sys <"$out/time"
      printf '%s %s round %d: cpu %.2f s (user %s sys %s) wall %s load %s\n' "$source" "$variant" "$round" \
        "$(echo "$user + $sys" | bc)" "$user" "$sys" "$wall" "$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
