# Sourced by the scripts that build: cmake and ctest are Debian's (3.25,
# the `cmake` package scripts/bootstrap installs), deliberately. The
# machine's PATH may put a pip-installed CMake 4.x first; the tree builds
# with it too, but one known version keeps CI and developers alike.
cmake() { /usr/bin/cmake "$@"; }
ctest() { /usr/bin/ctest "$@"; }
