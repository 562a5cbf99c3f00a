# Sourced by the scripts that build: cmake and ctest are Debian's (3.25,
# the `cmake` package scripts/bootstrap installs), deliberately. The
# machine's PATH may put a pip-installed CMake 4.x first; the tree builds
# with it too, but one known version keeps CI and developers alike.
cmake() { /usr/bin/cmake "$@"; }
ctest() { /usr/bin/ctest "$@"; }

# Compiles go through ccache (Debian's, installed by scripts/bootstrap) when
# it is there: a rebuild of a tree already compiled on this machine, in this
# folder or in another clone of it, costs seconds instead of minutes (libtorch
# headers dominate every compile). Paths are taken relative to the checkout
# and the build folder is not hashed, so two clones share hits. A launcher the
# caller set is kept; KVCHECK_CCACHE=0 turns it off. It takes effect when a
# build folder is first configured.
if [[ ${KVCHECK_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null 2>&1; then
  : "${CMAKE_CXX_COMPILER_LAUNCHER:=ccache}"
  : "${CMAKE_C_COMPILER_LAUNCHER:=ccache}"
  : "${CCACHE_BASEDIR:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
  : "${CCACHE_NOHASHDIR:=1}"
  export CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER CCACHE_BASEDIR CCACHE_NOHASHDIR
fi
