#!/usr/bin/env bash
# The kvcheck wheel (pyproject.toml at the root), as a Python user gets it:
# built from this checkout by the project's own build (scikit-build-core,
# without build isolation, in .venv: its torch 2.13.0 and
# python/requirements/wheel-build.txt), installed into a fresh virtual
# environment that gets torch 2.13.0 and nothing else, and run from there:
# `kvcheck` is on the environment's PATH, links the torch wheel's libtorch
# (no Debian library or dev package), the bundled adapters pass, the SDK
# example store passes run by the environment's own interpreter (no
# --python, no $KVCHECK_PYTHON), the walkthrough's LRU store passes at the
# default budget and its eviction bug is caught, and the SDK finds the
# wheel's kvcheck.
#   tests/wheel_test.sh [BUILD_DIR]   (default build/wheel, kept: a rebuild is incremental)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$root/build/wheel}
venv_python=$root/.venv/bin/python
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-wheel-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "wheel_test: $*" >&2; exit 1; }
pip_quiet=(--disable-pip-version-check -q)

start=$SECONDS
"$venv_python" -m pip wheel "${pip_quiet[@]}" --no-deps --no-build-isolation -C build-dir="$build_dir" \
  -w "$scratch/dist" "$root" >"$scratch/build.log" 2>&1 || { tail -40 "$scratch/build.log" >&2; fail "the wheel did not build"; }
wheels=("$scratch"/dist/kvcheck-*.whl)
[[ ${#wheels[@]} == 1 && -f ${wheels[0]} ]] || fail "pip wheel made no kvcheck-*.whl: $(ls "$scratch/dist")"
wheel=${wheels[0]}
echo "wheel_test: built $(basename "$wheel"), $(($(stat -c %s "$wheel") / 1024)) KiB, in $((SECONDS - start)) s"

# A fresh environment, made by the interpreter that made .venv, with the
# wheel and its dependencies, torch==2.13.0 and numpy (the pins of base.txt keep
# torch's own dependencies exact; no byte-compiling of torch's thousands of
# modules, which would cost more than the rest of the install).
start=$SECONDS
"$(readlink -f "$venv_python")" -m venv "$scratch/venv"
env=$scratch/venv
"$env/bin/python" -m pip install "${pip_quiet[@]}" --no-compile -c "$root/python/requirements/base.txt" "$wheel" \
  >"$scratch/install.log" 2>&1 || { tail -20 "$scratch/install.log" >&2; fail "the wheel did not install"; }
echo "wheel_test: installed with torch into a fresh venv in $((SECONDS - start)) s"

package=$("$env/bin/python" -c 'import kvcheck_adapter, os; print(os.path.dirname(kvcheck_adapter.__file__))')
# kvcheck is the torch-free front (adapters/kvcheck_front.cpp); kvcheck-core,
# beside it, is the command line that links libtorch.
binary=$package/_bin/kvcheck
core=$package/_bin/kvcheck-core
[[ -x $binary && -x $core && -f $package/_bin/libkvcheck_dumpshim.so ]] ||
  fail "the wheel has no _bin/kvcheck, _bin/kvcheck-core or its dump shim in $package"
libraries=$(ldd "$binary")
[[ $libraries != *"not found"* ]] || fail "the wheel's kvcheck misses libraries: $(grep 'not found' <<<"$libraries")"
[[ $libraries != *"libtorch"* ]] || fail "the wheel's kvcheck (the front) links libtorch: $libraries"
libraries=$(ldd "$core")
[[ $libraries != *"not found"* ]] || fail "the wheel's kvcheck-core misses libraries: $(grep 'not found' <<<"$libraries")"
[[ $libraries == *"$env/lib/"*"/torch/lib/libtorch_cpu.so"* ]] || fail "the wheel's kvcheck-core does not link the venv's torch: $libraries"
[[ $libraries != *"/usr/lib/x86_64-linux-gnu/libtorch"* ]] || fail "the wheel's kvcheck-core links Debian's libtorch"

# Run as a user runs it: the environment's bin first on PATH, no chosen
# interpreter, outside the source tree.
export PATH=$env/bin:/usr/bin:/bin
unset KVCHECK_PYTHON KVCHECK PYTHONPATH VIRTUAL_ENV
cd "$scratch"
version=$(kvcheck --version) || fail "kvcheck --version fails"
[[ $version == "kvcheck "* && $version == *"adapter protocol "* ]] || fail "unexpected --version: $version"
echo "wheel_test: $(command -v kvcheck): $version"
kvcheck run --adapter reference --adapter paged-reference --cases 20 --quiet --trace-dir "$scratch/traces" \
  >"$scratch/run.log" 2>&1 || { cat "$scratch/run.log" >&2; fail "the bundled reference adapters do not pass"; }
# The SDK example store, through a script that says which interpreter ran it.
cat >"$scratch/which_python_adapter.py" <<PY
import os, runpy, sys
with open("$scratch/adapter-python", "w") as out:
    out.write(sys.executable)
example = os.path.join("$package", "examples", "activation_memory_adapter.py")
sys.path.insert(0, os.path.dirname(example))
sys.argv = [example]
runpy.run_path(example, run_name="__main__")
PY
kvcheck run --adapter "$scratch/which_python_adapter.py" --cases 10 --quiet --trace-dir "$scratch/traces" \
  >"$scratch/example.log" 2>&1 || { cat "$scratch/example.log" >&2; fail "the SDK example store does not pass"; }
[[ $(cat "$scratch/adapter-python") == "$env/bin/python"* ]] || fail "the adapter ran under $(cat "$scratch/adapter-python"), not the wheel's environment"
echo "wheel_test: the SDK example store passes under the environment's own interpreter"
# The walkthrough's store (docs/walkthrough.md section 2, as written: an
# LRU store of 4 entries and its adapter declaring capacity 4, lru) at the
# default budget passes every property; with its eviction turned around
# (the most recent entry goes) eviction-as-declared fails.
awk '/^```python/ { inside = 1; next } /^```/ { if (inside) exit } inside' "$root/docs/walkthrough.md" >"$scratch/my_adapter.py"
grep -q 'capacity_items, eviction, listing = 4, "lru"' "$scratch/my_adapter.py" || fail "docs/walkthrough.md's first block is not the LRU adapter"
kvcheck run --adapter "$scratch/my_adapter.py" --trace-dir "$scratch/traces" >"$scratch/walkthrough.log" 2>&1 \
  || { cat "$scratch/walkthrough.log" >&2; fail "the walkthrough's LRU store does not pass at the default budget"; }
grep -q "eviction-as-declared  *pass" "$scratch/walkthrough.log" || fail "eviction-as-declared was not judged: $(cat "$scratch/walkthrough.log")"
sed 's/self.items.popitem(last=False)/self.items.popitem(last=True)/' "$scratch/my_adapter.py" >"$scratch/evicts_recent_adapter.py"
status=0
kvcheck run --adapter "$scratch/evicts_recent_adapter.py" --trace-dir "$scratch/traces" >"$scratch/evicts.log" 2>&1 || status=$?
[[ $status == 1 ]] && grep -q "ERROR: eviction-as-declared" "$scratch/evicts.log" \
  || { cat "$scratch/evicts.log" >&2; fail "evicting the most recent entry was not caught by eviction-as-declared (exit $status)"; }
echo "wheel_test: the walkthrough's LRU store passes the default budget; evicting the most recent fails eviction-as-declared"
"$env/bin/python" -B -c '
import sys
from kvcheck_adapter.locate import locate_kvcheck
found = locate_kvcheck()
assert found.found_by == "the kvcheck wheel" and found.path == sys.argv[1], found
print("wheel_test: the SDK finds", found.describe())
' "$binary"
echo "wheel_test: ok"
