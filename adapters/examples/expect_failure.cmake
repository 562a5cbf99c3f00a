# Runs kvcheck on a plugin that must fail, and checks how it fails: the exit
# code, and a "fail" verdict for the expected property in the JSON report.
#   cmake -DKVCHECK=kvcheck -DPLUGIN=x.so -DEXPECT_EXIT=1 -DEXPECT_FAILING=stored-immutable
#         [-DCASES=200] [-DWORK_DIR=dir] -P expect_failure.cmake
foreach(required KVCHECK PLUGIN EXPECT_EXIT EXPECT_FAILING)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "expect_failure.cmake: -D${required}=... is required")
  endif()
endforeach()
if(NOT DEFINED CASES)
  set(CASES 200)
endif()
if(NOT DEFINED WORK_DIR)
  set(WORK_DIR "${CMAKE_CURRENT_BINARY_DIR}/expect-failure")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

execute_process(
  COMMAND "${KVCHECK}" run --adapter "${PLUGIN}" --cases ${CASES} --report json
          --out "${WORK_DIR}/report.json" --trace-dir "${WORK_DIR}/traces" --quiet
  RESULT_VARIABLE exit_code)
if(NOT exit_code STREQUAL EXPECT_EXIT)
  message(FATAL_ERROR "kvcheck run --adapter ${PLUGIN} exited ${exit_code}, expected ${EXPECT_EXIT}")
endif()

file(READ "${WORK_DIR}/report.json" whole)
# One report for the run; this run checks one adapter.
string(JSON report GET "${whole}" adapters 0)
string(JSON count LENGTH "${report}" properties)
math(EXPR last "${count} - 1")
set(verdict "")
foreach(i RANGE ${last})
  string(JSON id GET "${report}" properties ${i} id)
  if(id STREQUAL EXPECT_FAILING)
    string(JSON verdict GET "${report}" properties ${i} verdict)
    if(verdict STREQUAL "fail")
      string(JSON trace GET "${report}" properties ${i} trace)
      message(STATUS "${EXPECT_FAILING} fails, as expected, with the trace:\n${trace}")
    endif()
  endif()
endforeach()
if(NOT verdict STREQUAL "fail")
  message(FATAL_ERROR "${EXPECT_FAILING}: verdict '${verdict}', expected 'fail'. Report:\n${report}")
endif()
