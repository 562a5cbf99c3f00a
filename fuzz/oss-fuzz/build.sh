#!/bin/bash -eu
# OSS-Fuzz / ClusterFuzzLite build script for kvcheck's fuzz targets.
# Honours the fuzzing services' variables:
#   $CC $CXX                 the compilers (clang)
#   $CFLAGS $CXXFLAGS        sanitizer and coverage flags (-fsanitize=address
#                            -fsanitize=fuzzer-no-link ...), applied to all of
#                            kvcheck's own code
#   $LIB_FUZZING_ENGINE      what a target links to get its engine
#                            (-fsanitize=fuzzer for libFuzzer)
#   $OUT                     where targets, seed corpora, dictionaries and
#                            options go
#   $SRC, $WORK              optional: the checkout (default: this repo) and
#                            scratch space (default: a temporary directory)
# Emits, per target: $OUT/<target>, <target>_seed_corpus.zip, <target>.dict,
# <target>.options. The canary (fuzz_ops_canary) is not shipped: it fails
# by design.
#
# libtorch comes from the build image (Debian: apt-get install libtorch-dev;
# see Dockerfile). It is built against libstdc++, so -stdlib=libc++ is
# dropped from $CXXFLAGS. The runner image has no libtorch: unless
# KVCHECK_BUNDLE_LIBS=0, every shared library a target needs (except the C
# library's own) is copied to $OUT/lib, which the targets' RUNPATH names.
#
# Local proof, as run for the fuzzing issue:
#   CC=clang-14 CXX=clang++-14 CFLAGS="-fsanitize=address -fsanitize=fuzzer-no-link" \
#   CXXFLAGS="-fsanitize=address -fsanitize=fuzzer-no-link" \
#   LIB_FUZZING_ENGINE=-fsanitize=fuzzer OUT=/tmp/out fuzz/oss-fuzz/build.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${SRC:+$SRC/kvcheck}
[[ -n "${src}" && -f "${src}/CMakeLists.txt" ]] || src=$(cd "$here/../.." && pwd)
work=${WORK:-$(mktemp -d)}
build=$work/kvcheck-fuzz-build
targets=(fuzz_ops fuzz_layout fuzz_dump_load fuzz_dump_load_deep fuzz_dump_archive)

cxxflags=${CXXFLAGS//-stdlib=libc++/}
mkdir -p "$OUT"
echo "kvcheck oss-fuzz build: CXX=$CXX CXXFLAGS=$cxxflags LIB_FUZZING_ENGINE=$LIB_FUZZING_ENGINE OUT=$OUT"
cmake -S "$src" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="${CFLAGS:-}" -DCMAKE_CXX_FLAGS="$cxxflags" \
  -DCMAKE_BUILD_RPATH='$ORIGIN/lib' \
  -DKVCHECK_FUZZ=ON -DKVCHECK_TESTS=OFF -DKVCHECK_SANITIZE=OFF -DKVCHECK_FUZZ_NO_TESTS=ON \
  -DKVCHECK_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" >"$work/kvcheck-configure.log" \
  || { cat "$work/kvcheck-configure.log"; exit 1; }
cmake --build "$build" --target "${targets[@]}"

for target in "${targets[@]}"; do
  name=${target#fuzz_}
  cp "$build/fuzz/$target" "$OUT/$target"
  rm -f "$OUT/${target}_seed_corpus.zip"
  (cd "$src/corpus/$name" && zip -q -r "$OUT/${target}_seed_corpus.zip" .)
  cp "$src/corpus/$name.dict" "$OUT/$target.dict"
  cp "$here/$target.options" "$OUT/$target.options"
done

if [[ "${KVCHECK_BUNDLE_LIBS:-1}" != 0 ]]; then
  mkdir -p "$OUT/lib"
  for target in "${targets[@]}"; do
    ldd "$OUT/$target" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | while read -r lib; do
    cp -L "$lib" "$OUT/lib/"
  done
fi
echo "kvcheck oss-fuzz build: wrote ${targets[*]} to $OUT"
