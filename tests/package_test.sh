#!/usr/bin/env bash
# The Debian package (cmake/kvcheckPackage.cmake): built from this build
# directory with cpack, unpacked into a fresh directory with dpkg-deb -x
# (as `dpkg -i` would lay it out under /, without root), and checked: the
# executable runs and names its version and protocol, the headers, the CMake
# package and the SDK are where they belong, and the SDK imports and finds
# the packaged kvcheck.
#   package_test.sh BUILD_DIR PYTHON CPACK
set -euo pipefail
build=$1
python=$2
cpack=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-package-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

fail() { echo "package_test: $*" >&2; exit 1; }

"$cpack" --config "$build/CPackConfig.cmake" -B "$scratch/out" >"$scratch/cpack.log" 2>&1 || { cat "$scratch/cpack.log" >&2; fail "cpack failed"; }
debs=("$scratch"/out/kvcheck_*.deb)
[[ ${#debs[@]} == 1 && -f ${debs[0]} ]] || fail "cpack made no kvcheck_*.deb: $(ls "$scratch/out")"
deb=${debs[0]}
echo "package_test: $(basename "$deb"), $(stat -c %s "$deb") bytes"
dpkg-deb --field "$deb" Package Version Depends Recommends
# Running kvcheck needs no -dev package: those are for building plugins.
depends=$(dpkg-deb --field "$deb" Depends)
[[ $depends != *"-dev"* ]] || fail "the package depends on a -dev package: $depends"

root=$scratch/root
dpkg-deb -x "$deb" "$root"
usr=$root/usr
for file in bin/kvcheck bin/kvcheck-core include/kvcheck/engine.h include/kvcheck/plugin.h lib/cmake/kvcheck/kvcheckConfig.cmake \
            lib/cmake/kvcheck/kvcheckAdapter.cmake lib/libkvcheck_dumpshim.so \
            share/kvcheck/python/pyproject.toml share/kvcheck/python/kvcheck_adapter/adapter.py \
            share/kvcheck/python/kvcheck_adapter/pytest_plugin.py; do
  [[ -e $usr/$file ]] || fail "the package has no /usr/$file"
done

version=$("$usr/bin/kvcheck" --version) || fail "the packaged kvcheck does not run"
echo "$version"
[[ $version == "kvcheck "* && $version == *"adapter protocol "* ]] || fail "unexpected --version: $version"
listed=$("$usr/bin/kvcheck" list) || fail "the packaged kvcheck's list fails"
[[ $listed == *$'\n  single-copy '* ]] || fail "the packaged kvcheck lists no properties: $listed"

# The packaged SDK, imported from its installed place, finds the packaged
# kvcheck on PATH and agrees with it on the protocol.
PATH=$usr/bin:/usr/bin:/bin PYTHONPATH=$usr/share/kvcheck/python KVCHECK= "$python" -B -c '
import sys
from kvcheck_adapter.locate import locate_kvcheck
found = locate_kvcheck()
assert found.found_by == "PATH" and found.path == sys.argv[1], found
print("package_test: the SDK finds", found.describe())
' "$usr/bin/kvcheck"
# The packaged kvcheck preloads its own dump shim (/usr/lib, found where
# the loader found it) into an adapter process: the example store's dumps
# are killed and power-cut (dump_fork), so dump-safe has no NOT APPLIED note.
example=$(cd "$(dirname "$0")/.." && pwd)/python/examples/activation_memory_adapter.py
run=$(cd "$scratch" && KVCHECK_PYTHON="$python" "$usr/bin/kvcheck" run --adapter "$example" --property dump-safe \
      --cases 10 --quiet --trace-dir "$scratch/traces" 2>&1) || fail "the packaged kvcheck fails on the example store: $run"
[[ $run != *"NOT APPLIED: dump-safe"* && $run == *"dump-safe     pass "* ]] || fail "the packaged kvcheck did not kill the example store's dumps: $run"
echo "package_test: the example store's dumps are killed under the packaged kvcheck"
echo "package_test: ok"
