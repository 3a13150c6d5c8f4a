# Locates the CUTLASS/CuTe headers shipped by the nvidia-cutlass wheel
# (cutlass_library/source/include and .../tools/util/include) without importing its
# Python code (which needs packages the headers do not), and checks the release.
# A CUTLASS source checkout can be used instead with -DCUTLASSFUSE_CUTLASS_DIR=<root>.

set(CUTLASSFUSE_CUTLASS_DIR "" CACHE PATH "CUTLASS source root (default: the nvidia-cutlass wheel)")

if(CUTLASSFUSE_CUTLASS_DIR STREQUAL "")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.util, os
spec = importlib.util.find_spec("cutlass_library")
if spec is None or not spec.submodule_search_locations:
    raise SystemExit(1)
print(os.path.join(list(spec.submodule_search_locations)[0], "source"))
]=]
    OUTPUT_VARIABLE _cutlass_root
    RESULT_VARIABLE _cutlass_result
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT _cutlass_result EQUAL 0)
    message(FATAL_ERROR
      "cutlassfuse: the CUTLASS headers were not found: install them with "
      "`pip install nvidia-cutlass==${CUTLASSFUSE_CUTLASS_VERSION}.0` in this environment "
      "(or pass -DCUTLASSFUSE_CUTLASS_DIR=<CUTLASS source root>).")
  endif()
  set(CUTLASSFUSE_CUTLASS_DIR "${_cutlass_root}")
endif()

set(_cutlass_version_header "${CUTLASSFUSE_CUTLASS_DIR}/include/cutlass/version.h")
if(NOT EXISTS "${_cutlass_version_header}" OR NOT EXISTS "${CUTLASSFUSE_CUTLASS_DIR}/include/cute/tensor.hpp")
  message(FATAL_ERROR "cutlassfuse: ${CUTLASSFUSE_CUTLASS_DIR} holds no CUTLASS/CuTe headers (include/cutlass, include/cute).")
endif()
file(STRINGS "${_cutlass_version_header}" _cutlass_version_lines REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
set(CUTLASSFUSE_FOUND_CUTLASS_VERSION "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "CUTLASS_${_part} ([0-9]+)" _ "${_cutlass_version_lines}")
  list(APPEND CUTLASSFUSE_FOUND_CUTLASS_VERSION "${CMAKE_MATCH_1}")
endforeach()
list(JOIN CUTLASSFUSE_FOUND_CUTLASS_VERSION "." CUTLASSFUSE_FOUND_CUTLASS_VERSION)
if(NOT CUTLASSFUSE_FOUND_CUTLASS_VERSION VERSION_EQUAL CUTLASSFUSE_CUTLASS_VERSION)
  message(FATAL_ERROR
    "cutlassfuse: found CUTLASS ${CUTLASSFUSE_FOUND_CUTLASS_VERSION} at ${CUTLASSFUSE_CUTLASS_DIR}, "
    "but the kernels are written against ${CUTLASSFUSE_CUTLASS_VERSION}: "
    "`pip install nvidia-cutlass==${CUTLASSFUSE_CUTLASS_VERSION}.0`.")
endif()
message(STATUS "cutlassfuse: CUTLASS ${CUTLASSFUSE_FOUND_CUTLASS_VERSION} at ${CUTLASSFUSE_CUTLASS_DIR}")

add_library(cutlassfuse::cutlass INTERFACE IMPORTED)
target_include_directories(cutlassfuse::cutlass SYSTEM INTERFACE
  "${CUTLASSFUSE_CUTLASS_DIR}/include"
  "${CUTLASSFUSE_CUTLASS_DIR}/tools/util/include")
