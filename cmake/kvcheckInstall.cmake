# Install rules and the CMake package, so that engine adapters can be built
# outside the tree:
#   cmake --install build/default --prefix P
# installs P/bin/kvcheck, P/lib/libkvcheck_harness.a, P/include/kvcheck/*.h
# and P/lib/cmake/kvcheck/ (kvcheckConfig.cmake, its version file, the
# exported targets and kvcheck_add_adapter). See kvcheckConfig.cmake.in for
# what find_package(kvcheck) gives. Included once, at the end of the
# top-level CMakeLists.txt, when every target it installs exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVCHECK_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/kvcheck")

# The harness names its include directory as a source path, which is right
# in the tree and wrong once installed: the package's headers live in
# include/ (included as <kvcheck/engine.h>).
get_target_property(kvcheck_harness_includes kvcheck_harness INTERFACE_INCLUDE_DIRECTORIES)
set(kvcheck_harness_interface "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
foreach(dir IN LISTS kvcheck_harness_includes)
  list(APPEND kvcheck_harness_interface "$<BUILD_INTERFACE:${dir}>")
endforeach()
set_property(TARGET kvcheck_harness PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${kvcheck_harness_interface}")
set_target_properties(kvcheck_harness PROPERTIES EXPORT_NAME harness)
# kvcheck_harness uses kvcheck_warnings privately; a static library's
# private dependencies go into its export too, so the warnings target is
# exported with it (a consumer gets its flags only by linking it).
set_target_properties(kvcheck_warnings PROPERTIES EXPORT_NAME warnings)

# The dump shim is a shared library the harness links (harness/CMakeLists.txt):
# it is installed next to it, and an engine run as a program of its own can
# be started with LD_PRELOAD=P/lib/libkvcheck_dumpshim.so.
set_target_properties(kvcheck_dumpshim PROPERTIES EXPORT_NAME dumpshim)

install(TARGETS kvcheck_harness kvcheck_warnings kvcheck_dumpshim
  EXPORT kvcheckTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET kvcheck)
  # Installed, kvcheck still finds libtorch (and any library linked from
  # outside the system directories) where it was linked from.
  # The dump shim it links is installed in the package's own lib/.
  # kvcheck-core goes beside kvcheck, which runs it (adapters/kvcheck_front.cpp).
  set_target_properties(kvcheck kvcheck-core PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON
    INSTALL_RPATH "\$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS kvcheck EXPORT kvcheckTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(TARGETS kvcheck-core RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/harness/include/kvcheck/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvcheck
  FILES_MATCHING PATTERN "*.h")
install(EXPORT kvcheckTargets NAMESPACE kvcheck:: DESTINATION ${KVCHECK_INSTALL_CMAKEDIR})

# Values the package config reports.
file(STRINGS ${PROJECT_SOURCE_DIR}/harness/include/kvcheck/plugin.h kvcheck_abi_line
  REGEX "^#define KVCHECK_PLUGIN_ABI_VERSION [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" KVCHECK_PLUGIN_ABI_VERSION "${kvcheck_abi_line}")
set(KVCHECK_BOOST_VERSION 1.81)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvcheckConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvcheckConfig.cmake
  INSTALL_DESTINATION ${KVCHECK_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the adapter interface.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvcheckConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/kvcheckConfig.cmake
  ${PROJECT_BINARY_DIR}/kvcheckConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/kvcheckAdapter.cmake
  DESTINATION ${KVCHECK_INSTALL_CMAKEDIR})
