#!/usr/bin/env bash
# The cost of a cold build (issue 39: CI builds the tree three times from
# nothing), with and without the precompiled headers (cmake/kvcheckPch.cmake),
# side by side in one run: for each of KVCHECK_PCH=OFF and ON, a fresh build
# folder under $TMPDIR configured with the preset, ccache disabled, built at
# -j2; CPU (user + sys of every compiler and linker) and wall of the build
# step, and the load before and after. The folders are removed after.
#   bench/build_cost.sh PRESET [TARGET...] [-- OUT.json]
# e.g. bench/build_cost.sh default; bench/build_cost.sh fuzz; bench/build_cost.sh default kvcheck_harness
set -euo pipefail
source "$(dirname "$0")/../scripts/lib/cmake.sh"
cd "$(dirname "$0")/.."
preset=${1:?usage: bench/build_cost.sh PRESET [TARGET...] [-- OUT.json]}
shift
targets=() out=""
while (($#)); do
  if [[ $1 == -- ]]; then out=${2:?-- needs a file}; break; fi
  targets+=("$1"); shift
done
export CCACHE_DISABLE=1
rows=()
for pch in OFF ON; do
  dir=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-build-cost.XXXXXX")
  cmake --preset "$preset" -B "$dir" -DKVCHECK_PCH=$pch >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log" >&2; rm -rf "$dir" "$dir.configure.log"; exit 1; }
  rm -f "$dir.configure.log"
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  target_args=()
  ((${#targets[@]} == 0)) || target_args=(--target "${targets[@]}")
  /usr/bin/time -f "%e %U %S" -o "$dir.time" cmake --build "$dir" -j2 "${target_args[@]}" >"$dir.log" 2>&1 \
    || { tail -30 "$dir.log" >&2; rm -rf "$dir" "$dir.log" "$dir.time"; exit 1; }
  read -r wall user sys <"$dir.time"
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')
  load_after=$(cut -d' ' -f1 /proc/loadavg)
  steps=$(grep -c '^\[' "$dir.log" || true)
  rm -rf "$dir" "$dir.log" "$dir.time"
  echo "$preset KVCHECK_PCH=$pch: $steps steps, CPU $cpu s ($user user + $sys sys), wall $wall s, load $load_before -> $load_after"
  rows+=("{\"pch\": \"$pch\", \"steps\": $steps, \"cpu_s\": $cpu, \"user_s\": $user, \"sys_s\": $sys, \"wall_s\": $wall, \"load_1min_before\": $load_before, \"load_1min_after\": $load_after}")
done
if [[ -n $out ]]; then
  joined=$(IFS=,; echo "${rows[*]}")
  printf '{"preset": "%s", "targets": "%s", "jobs": 2, "ccache": "disabled", "builds": [%s]}\n' \
    "$preset" "${targets[*]:-all}" "$joined" | python3 -m json.tool >"$out"
fi
