# The build of the Python wheel (pyproject.toml at the root, KVCHECK_WHEEL):
# libtorch is the one the build's torch wheel ships, never Debian's, and
# kvcheck with its dump shim is installed into the kvcheck_adapter package
# (component "wheel"), where the SDK's console script runs it
# (python/kvcheck_adapter/_tool.py). Included twice: before
# find_package(Torch) to point it at the wheel's torch, and after the
# targets exist (KVCHECK_WHEEL_INSTALL) to install them.
if(NOT KVCHECK_WHEEL_INSTALL)
  # scikit-build-core names the interpreter that builds; a plain configure
  # with -DKVCHECK_WHEEL=ON finds one.
  if(NOT Python_EXECUTABLE)
    find_package(Python COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE kvcheck_torch_root OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE kvcheck_torch_found)
  if(NOT kvcheck_torch_found EQUAL 0)
    message(FATAL_ERROR "KVCHECK_WHEEL: ${Python_EXECUTABLE} cannot import torch; the wheel is built against "
                        "the libtorch of torch 2.13.0 (pip install torch==2.13.0)")
  endif()
  # Torch's own config searches the system's prefixes first: a machine with
  # Debian's libtorch-dev would otherwise mix the two.
  set(Torch_DIR ${kvcheck_torch_root}/share/cmake/Torch CACHE PATH "" FORCE)
  set(Caffe2_DIR ${kvcheck_torch_root}/share/cmake/Caffe2 CACHE PATH "" FORCE)
  set(TORCH_LIBRARY ${kvcheck_torch_root}/lib/libtorch.so CACHE FILEPATH "" FORCE)
  set(c10_LIBRARY ${kvcheck_torch_root}/lib/libc10.so CACHE FILEPATH "" FORCE)
  message(STATUS "KVCHECK_WHEEL: libtorch of ${kvcheck_torch_root}")
  return()
endif()

# site-packages/kvcheck_adapter/_bin/kvcheck (and kvcheck-core, which it
# runs) finds the shim beside it and libtorch in the torch package:
# site-packages/torch/lib.
set_target_properties(kvcheck kvcheck-core kvcheck_dumpshim PROPERTIES
  INSTALL_RPATH "$ORIGIN:$ORIGIN/../../torch/lib" BUILD_WITH_INSTALL_RPATH OFF)
install(TARGETS kvcheck kvcheck-core kvcheck_dumpshim
  RUNTIME DESTINATION kvcheck_adapter/_bin COMPONENT wheel
  LIBRARY DESTINATION kvcheck_adapter/_bin COMPONENT wheel)
# The example stores (python/examples): `kvcheck run` with no --adapter
# checks the SDK example beside the bundled adapters, as from the sources.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/examples/
  DESTINATION kvcheck_adapter/examples COMPONENT wheel
  PATTERN "__pycache__" EXCLUDE
  PATTERN "*.pyc" EXCLUDE)
