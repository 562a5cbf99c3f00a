# The Python SDK installed with kvcheck, and a Debian package of it all:
#   cpack --config build/default/CPackConfig.cmake -B OUT
# makes OUT/kvcheck_<version>_amd64.deb holding what `cmake --install`
# installs (kvcheckInstall.cmake: bin/kvcheck, the harness library, the
# headers, the CMake package) and the SDK, under /usr. Installed, kvcheck
# puts the packaged SDK on a Python adapter's PYTHONPATH
# (harness/cli/adapters.cpp), and `pip install /usr/share/kvcheck/python`
# installs it, with its pytest plugin, into an environment.
# tests/package_test.sh builds the package and checks what it installs.
include(GNUInstallDirs)

set(KVCHECK_INSTALL_SDKDIR "${CMAKE_INSTALL_DATADIR}/kvcheck/python")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kvcheck_adapter
  DESTINATION ${KVCHECK_INSTALL_SDKDIR}
  PATTERN "__pycache__" EXCLUDE
  PATTERN "*.pyc" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/python/pyproject.toml ${PROJECT_SOURCE_DIR}/python/README.md
  DESTINATION ${KVCHECK_INSTALL_SDKDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvcheck)
set(CPACK_PACKAGE_VENDOR kvcheck)
set(CPACK_PACKAGE_CONTACT "kvcheck developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "verification and fuzz-testing harness for KV-cache ownership")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# kvcheck links Debian's libtorch 1.13: the runtime library is all it needs
# to run. Building a plugin against the installed package needs libtorch's
# headers and CMake package and Boost's headers too: recommended, not
# required, so that a CI image that only runs kvcheck installs no -dev
# package (tests/package_test.sh checks the fields).
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libtorch1.13")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, libtorch-dev (>= 1.13), libboost1.81-dev")
# Stripped and gzip-compressed: a package built in a test takes seconds, not
# the minutes xz takes over the unstripped binaries.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
include(CPack)
