# Script-mode test of the flags per compiler (cmake/ZerorunFlags.cmake): cmake -P tests/windows/cmake_flags_test.cmake
# No Visual Studio runs here, so this evaluates the choice CMakeLists.txt makes for cl.exe against the one for GCC:
# cl.exe never gets a GCC option (-Wall, -Wextra, -f..., -march), GCC never a cl one, nvcc only -Xcompiler=...
# (the host compiler's flags in its own spelling), and no compiler gets machine flags.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/ZerorunFlags.cmake)

set(failures 0)
macro(check what)
  if(NOT (${ARGN}))
    message(SEND_ERROR "FAIL: ${what}")
    math(EXPR failures "${failures} + 1")
  endif()
endmacro()
# Each of the items is in the list variable `var` (what: how the failure names it, the item appended).
macro(check_has var what)
  foreach(want ${ARGN})
    list(FIND ${var} ${want} i)
    check("${what} ${want}" i GREATER -1)
  endforeach()
endmacro()

foreach(sanitize OFF ON)
  # ---- MSVC (cl.exe / clang-cl) ----
  zerorun_compile_flags(MSVC ${sanitize} OFF)
  foreach(f IN LISTS ZR_CXX_OPTIONS)
    check("MSVC C++ option '${f}' is not in cl's /spelling" f MATCHES "^/")
  endforeach()
  check_has(ZR_CXX_OPTIONS "MSVC C++ options lack" /W4 /utf-8 /permissive- /Zc:__cplusplus)
  foreach(f IN LISTS ZR_CUDA_OPTIONS)
    check("MSVC nvcc option '${f}' is not -Xcompiler=/..." f MATCHES "^-Xcompiler=/[^,]*(,/[^,]*)*$")
  endforeach()
  string(FIND "${ZR_CUDA_OPTIONS}" "/utf-8" i)
  check("nvcc's cl.exe host pass lacks /utf-8" i GREATER -1)
  check("MSVC link options '${ZR_LINK_OPTIONS}' not empty" NOT ZR_LINK_OPTIONS)
  check("MSVC optim.cc options '${ZR_OPTIM_OPTIONS}' not empty" NOT ZR_OPTIM_OPTIONS)
  check_has(ZR_DEFINITIONS "MSVC definitions (windows.h's min/max macros break std::min) lack" NOMINMAX)
  set(msvc_all "${ZR_CXX_OPTIONS};${ZR_CUDA_OPTIONS}")

  # ---- GNU (GCC, Clang, MinGW-w64) ----
  zerorun_compile_flags(GNU ${sanitize} OFF)
  foreach(f IN LISTS ZR_CXX_OPTIONS ZR_OPTIM_OPTIONS ZR_LINK_OPTIONS)
    check("GNU option '${f}' is not in GCC's -spelling" f MATCHES "^-[^/]*$")
  endforeach()
  check_has(ZR_CXX_OPTIONS "GNU C++ options lack" -Wall -Wextra)
  foreach(f IN LISTS ZR_CUDA_OPTIONS)
    check("GNU nvcc option '${f}' is not -Xcompiler=-..." f MATCHES "^-Xcompiler=-[^,]*(,-[^,]*)*$")
  endforeach()
  check_has(ZR_OPTIM_OPTIONS "GNU optim.cc options (the clones' bits) lack" -ffp-contract=off)
  if(sanitize)
    check_has(ZR_CXX_OPTIONS "GNU sanitize options lack" -fsanitize=address -fsanitize=undefined)
    check("GNU sanitize links without ASan" ZR_LINK_OPTIONS MATCHES "-fsanitize=address")
  endif()

  foreach(f IN LISTS msvc_all ZR_CXX_OPTIONS ZR_CUDA_OPTIONS)
    check("machine flag '${f}' (a binary must run on any x86-64)" NOT f MATCHES "-march|-mtune|-mavx|/arch:")
  endforeach()
endforeach()

if(failures GREATER 0)
  message(FATAL_ERROR "cmake flags: ${failures} check(s) failed")
endif()
message(STATUS "cmake flags: MSVC and GNU selections as expected (plain and sanitize)")
