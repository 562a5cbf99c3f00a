# Precompiled headers (issue 39: CI builds the tree three times from
# nothing). The heavy third-party headers - libtorch's ATen/core/Tensor.h
# (about 150,000 lines once preprocessed), GoogleTest and the standard
# library - are parsed once per group of targets instead of once per
# translation unit. Only third-party and standard headers go in: a header
# of ours missing from a source still fails to compile.
#
# A group is one precompiled header, built by a target of its own
# (kvcheck_pch_<group>: one empty source, the group's flags) and reused by
# its members (REUSE_FROM), which needs the same compiler flags. So groups
# differ by what changes flags: position-independent code (the harness,
# linked into plugins) and libtorch's compile flags, which a target linking
# libtorch gets even where its sources do not include it: gcc refuses a
# header precompiled without -D_GLIBCXX_USE_CXX11_ABI=1 in a source
# compiled with it, and the other way round. (Other definitions of the
# target's own may differ: gcc and clang-14 accept a macro that only the
# header or only the source defines, unless the header uses it, and refuse
# one defined differently; -Winvalid-pch with -Werror makes any mismatch a
# build error.) The owner
# is a target of its own because REUSE_FROM makes the members depend on
# it: on a member, they would wait for its whole build and link.
#   kvcheck_precompile(<target> <group> [TORCH_FREE <source>...])
# Groups: torch (torch + std), torch-test (torch + GoogleTest + std),
# std, std-torch-flags (std, for targets with libtorch's flags),
# std-test (GoogleTest + std), std-pic (the harness).
# TORCH_FREE: the sources of a torch group's target that do not include
# libtorch: they are compiled without the header, as before, so that no
# source sees libtorch's names without asking for them (src/archive.cpp's
# own quoted() lost to std::quoted, which libtorch brings, by
# argument-dependent lookup). A source missing from the list compiles, only
# with libtorch visible; one listed that includes libtorch compiles, only
# without the speed-up.
#
# KVCHECK_PCH=OFF builds without them (as before). With ccache as the
# compiler launcher a rebuild still hits: ccache's manual ("Precompiled
# headers") asks for the sloppiness below, which the launcher gets here
# (whatever set it: scripts/lib/cmake.sh or the environment), and for gcc's
# -fpch-preprocess (the preprocessed source ccache hashes then names the
# header instead of expanding it). Without them ccache would compile every
# source that uses a precompiled header and cache nothing.
option(KVCHECK_PCH "Precompiled headers for the heavy third-party headers (libtorch, GoogleTest, the standard library)" ON)

set(kvcheck_pch_std
  <algorithm> <array> <cstdint> <cstring> <functional> <map> <memory> <optional> <set> <stdexcept>
  <string> <string_view> <tuple> <unordered_map> <utility> <variant> <vector>)
set(kvcheck_pch_torch ${kvcheck_pch_std}
  <ATen/core/Tensor.h> <ATen/EmptyTensor.h> <ATen/Parallel.h> <ATen/ops/cat.h> <ATen/ops/empty.h>
  <ATen/ops/equal.h> <ATen/ops/zeros.h>)
set(kvcheck_pch_torch-test ${kvcheck_pch_torch} <gtest/gtest.h>)
set(kvcheck_pch_std-test ${kvcheck_pch_std} <gtest/gtest.h>)
set(kvcheck_pch_std-pic ${kvcheck_pch_std})
set(kvcheck_pch_std-torch-flags ${kvcheck_pch_std})

if(KVCHECK_PCH AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fpch-preprocess>)
endif()
if(KVCHECK_PCH AND CMAKE_CXX_COMPILER_LAUNCHER MATCHES "(^|/)ccache$")
  set(kvcheck_ccache_sloppiness pch_defines,time_macros,include_file_mtime,include_file_ctime)
  if(DEFINED ENV{CCACHE_SLOPPINESS})
    string(PREPEND kvcheck_ccache_sloppiness "$ENV{CCACHE_SLOPPINESS},")
  endif()
  # For the targets made from here on (every one of ours: the directories
  # are added after this file).
  set(CMAKE_CXX_COMPILER_LAUNCHER env CCACHE_SLOPPINESS=${kvcheck_ccache_sloppiness} ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()

# The owners, made here: a group's owner links what gives the group its
# flags (libtorch's definitions and include directories, GoogleTest's).
function(kvcheck_pch_owner group)
  set(owner kvcheck_pch_${group})
  set(source ${PROJECT_BINARY_DIR}/kvcheck_pch_empty.cpp)
  if(NOT EXISTS ${source})
    file(WRITE ${source} "// The source of the precompiled headers' owners (cmake/kvcheckPch.cmake).\n")
  endif()
  add_library(${owner} OBJECT ${source})
  target_link_libraries(${owner} PRIVATE ${ARGN} kvcheck_warnings)
  target_precompile_headers(${owner} PRIVATE ${kvcheck_pch_${group}})
endfunction()

function(kvcheck_precompile target group)
  if(NOT KVCHECK_PCH)
    return()
  endif()
  if(NOT DEFINED kvcheck_pch_${group})
    message(FATAL_ERROR "kvcheck_precompile(${target}): no group '${group}' (cmake/kvcheckPch.cmake)")
  endif()
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "TORCH_FREE")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvcheck_precompile(${target}): unexpected arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(arg_TORCH_FREE)
    set_source_files_properties(${arg_TORCH_FREE} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
  if(NOT TARGET kvcheck_pch_${group})
    if(group MATCHES "^torch|torch-flags$")
      set(group_links torch)
    endif()
    if(group MATCHES "-test$")
      list(APPEND group_links GTest::gtest)
    endif()
    kvcheck_pch_owner(${group} ${group_links})
    if(group STREQUAL "std-pic")
      set_target_properties(kvcheck_pch_${group} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    endif()
  endif()
  target_precompile_headers(${target} REUSE_FROM kvcheck_pch_${group})
endfunction()
