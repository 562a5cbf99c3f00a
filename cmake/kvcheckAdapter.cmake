# kvcheck_add_adapter(<target> SOURCES <file>... [LINK_LIBRARIES <lib>...])
#
# Builds a kvcheck engine adapter plugin: a MODULE library <target>.so (no
# "lib" prefix) linking the kvcheck harness, that exports exactly one
# symbol, the versioned entry point KVCHECK_PLUGIN defines
# (kvcheck_plugin_v<N>). Everything else, including the harness code linked
# into it, stays hidden, so a plugin never interposes on kvcheck's own
# symbols nor on another plugin's. Check it with
#   kvcheck run --adapter $<TARGET_FILE:<target>>
#
# Shipped in kvcheck's CMake package (find_package(kvcheck) includes it) and
# used in-tree for the bundled test plugins, where it links kvcheck_harness.
function(kvcheck_add_adapter target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LINK_LIBRARIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvcheck_add_adapter(${target}): unexpected arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "kvcheck_add_adapter(${target}): SOURCES is required")
  endif()
  if(TARGET kvcheck::harness)
    set(harness kvcheck::harness)
  elseif(TARGET kvcheck_harness)
    set(harness kvcheck_harness)
  else()
    message(FATAL_ERROR "kvcheck_add_adapter(${target}): no kvcheck harness target; call find_package(kvcheck) first")
  endif()

  add_library(${target} MODULE ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE ${harness} ${arg_LINK_LIBRARIES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)

  # Visibility alone does not hide the static harness nor the std::
  # template instances: a version script exports the entry point only.
  set(exports "${CMAKE_CURRENT_BINARY_DIR}/${target}.exports")
  file(WRITE "${exports}" "{\n  global: kvcheck_plugin_v*;\n  local: *;\n};\n")
  target_link_options(${target} PRIVATE "LINKER:--version-script=${exports}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${exports}")
endfunction()
