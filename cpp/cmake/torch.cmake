# Describes the torch installed in the build's Python environment as the imported
# target cutlassfuse::torch (headers, libraries, C++ ABI), from what torch itself
# reports: the same facts torch.utils.cpp_extension uses.
#
# Why not find_package(Torch): its config appends gencode flags for a long list of
# "common" architectures to the global CMAKE_CUDA_FLAGS when no GPU is present,
# leaves CUDA_nvrtc_LIBRARY NOTFOUND against a toolkit without nvrtc, and re-runs its
# own CUDA discovery. The extension needs none of that: it links libtorch and sets
# its own per-target architectures.

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c [=[
import os, sys, torch
from torch.utils import cpp_extension as ext
root = os.path.dirname(torch.__file__)
print(torch.__version__)
print(torch.version.cuda or "")
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(",".join(ext.include_paths()))
print(os.path.join(root, "lib"))
# The CUDA wheels of torch ship cuBLAS/cuSPARSE/... headers here; a lean system
# toolkit may lack them, and ATen/cuda headers include them.
print(os.path.join(os.path.dirname(root), "nvidia", "cu" + (torch.version.cuda or "0").split(".")[0], "include"))
# The C++ runtime this process runs torch with (Linux: the libstdc++ mapped now).
maps = "/proc/self/maps"
loaded = [line.split()[-1] for line in open(maps)] if os.path.exists(maps) else []
print(next((path for path in loaded if os.path.basename(path).startswith("libstdc++.so")), ""))
]=]
  OUTPUT_VARIABLE _torch_facts
  ERROR_VARIABLE _torch_error
  RESULT_VARIABLE _torch_result
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR
    "cutlassfuse: `import torch` failed in ${Python_EXECUTABLE}:\n${_torch_error}\n"
    "Install torch in this environment first and build with "
    "`pip install --no-build-isolation .` so the extension is compiled against it.")
endif()
string(REPLACE "\n" ";" _torch_facts "${_torch_facts}")
list(GET _torch_facts 0 CUTLASSFUSE_TORCH_VERSION)
list(GET _torch_facts 1 CUTLASSFUSE_TORCH_CUDA_VERSION)
list(GET _torch_facts 2 _torch_cxx11_abi)
list(GET _torch_facts 3 _torch_include_dirs)
list(GET _torch_facts 4 _torch_lib_dir)
list(GET _torch_facts 5 _torch_nvidia_include_dir)
list(LENGTH _torch_facts _torch_fact_count)
set(CUTLASSFUSE_CXX_RUNTIME "")
if(_torch_fact_count GREATER 6)
  list(GET _torch_facts 6 CUTLASSFUSE_CXX_RUNTIME)
endif()
string(REPLACE "," ";" _torch_include_dirs "${_torch_include_dirs}")
message(STATUS "cutlassfuse: torch ${CUTLASSFUSE_TORCH_VERSION} (CUDA ${CUTLASSFUSE_TORCH_CUDA_VERSION}) at ${_torch_lib_dir}")

# torch_python: the pybind11 type casters of the module's functions (python_module.cpp).
set(_torch_libs c10 torch torch_cpu torch_python)
if(CUTLASSFUSE_CUDA)
  if(CUTLASSFUSE_TORCH_CUDA_VERSION STREQUAL "")
    message(FATAL_ERROR
      "cutlassfuse: the installed torch ${CUTLASSFUSE_TORCH_VERSION} is a CPU-only build, "
      "but the CUDA kernels were requested. Install a CUDA build of torch, or build the "
      "CPU-only library with -C cmake.define.CUTLASSFUSE_CUDA=OFF.")
  endif()
  list(APPEND _torch_libs c10_cuda torch_cuda)
  if(EXISTS "${_torch_nvidia_include_dir}")
    list(APPEND _torch_include_dirs "${_torch_nvidia_include_dir}")
  endif()
endif()

add_library(cutlassfuse::torch INTERFACE IMPORTED)
target_include_directories(cutlassfuse::torch SYSTEM INTERFACE ${_torch_include_dirs})
target_compile_definitions(cutlassfuse::torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_cxx11_abi})
# Searched anew at every configure (no cache entry, and none left by older builds): a
# cached path would outlive a change of environment in a reused build directory and
# link the previous torch.
foreach(_lib IN LISTS _torch_libs)
  unset(CUTLASSFUSE_TORCH_LIB_${_lib} CACHE)
  find_library(CUTLASSFUSE_TORCH_LIB_${_lib} ${_lib} PATHS "${_torch_lib_dir}" NO_DEFAULT_PATH NO_CACHE REQUIRED)
  target_link_libraries(cutlassfuse::torch INTERFACE "${CUTLASSFUSE_TORCH_LIB_${_lib}}")
endforeach()
# The extension shares torch's C++ runtime. A compiler installed with only a static
# libstdc++ (libstdc++.a; g++ -print-file-name=libstdc++.so finds nothing) would copy its
# own runtime into the module, and the process would then run two: the copy's symbols
# are exported, so the process's libstdc++.so interposes some of them, and the module's
# streams mix the copy's code with the other runtime's locale objects (a segfault at the
# first integer formatted into an error message). Naming the shared library first
# resolves every C++ runtime symbol to it, and the static archive contributes nothing.
if(NOT CUTLASSFUSE_CXX_RUNTIME STREQUAL "")
  message(STATUS "cutlassfuse: C++ runtime ${CUTLASSFUSE_CXX_RUNTIME}")
  target_link_libraries(cutlassfuse::torch INTERFACE "${CUTLASSFUSE_CXX_RUNTIME}")
endif()
