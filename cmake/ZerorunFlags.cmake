# Compile flags per compiler (issue 36), chosen in one function so a script-mode test
# (tests/windows/cmake_flags_test.cmake, `cmake -P`) can evaluate the choice for MSVC without Visual Studio.
#
# zerorun_compile_flags(<MSVC|GNU> <sanitize: ON|OFF> <fuzz: ON|OFF>) sets, in the caller's scope:
#   ZR_CXX_OPTIONS    options for C++ sources, in the compiler's own spelling
#   ZR_CUDA_OPTIONS   options for .cu sources: the host compiler's flags through nvcc's -Xcompiler (nvcc itself
#                     rejects -Wall and would read /W4 as a file name), nothing else
#   ZR_DEFINITIONS    definitions for every language
#   ZR_LINK_OPTIONS   link options
#   ZR_OPTIM_OPTIONS  extra options for kernels/cpu/optim.cc (below)
#
# MSVC (cl.exe, and clang-cl, which takes cl's options): /W4 without the conversion warnings GCC's -Wall -Wextra do
# not give either (C4244, C4267, C4305: int64_t -> int, size_t -> int, double -> float), /utf-8 (sources and
# strings are UTF-8), /permissive- and /Zc:__cplusplus (standard C++ and an honest __cplusplus), /bigobj (the
# kernels' templates), /EHsc is CMake's default. OpenMP comes from FindOpenMP (/openmp: OpenMP 2.0, which the
# sources keep to: tests/windows/msvc_proxy_check.sh). nvcc's host pass gets /W3 /utf-8 /Zc:__cplusplus /bigobj
# (not /permissive-: the CUDA headers are not written for it). GNU (GCC, Clang, MinGW-w64): -Wall -Wextra for C++ and
# for nvcc's host pass. No -march or other machine flags for any compiler: kernels/cpu/optim.cc picks its ISA at run
# time, and a binary must run on any x86-64.
function(zerorun_compile_flags style sanitize fuzz)
  set(cxx "")
  set(cuda "")
  set(defs "")
  set(link "")
  set(optim "")
  if(style STREQUAL "MSVC")
    list(APPEND cxx /W4 /wd4244 /wd4267 /wd4305 /utf-8 /permissive- /Zc:__cplusplus /bigobj)
    list(APPEND cuda "-Xcompiler=/W3,/utf-8,/Zc:__cplusplus,/bigobj")
    list(APPEND defs NOMINMAX _CRT_SECURE_NO_WARNINGS)
    if(sanitize)
      list(APPEND cxx /fsanitize=address /Zi)  # MSVC has AddressSanitizer, no UBSan
    endif()
    if(fuzz)
      message(FATAL_ERROR "ZERORUN_FUZZ needs clang with its GNU-style driver (CXX=clang++): libFuzzer is part of clang")
    endif()
  elseif(style STREQUAL "GNU")
    list(APPEND cxx -Wall -Wextra)
    list(APPEND cuda "-Xcompiler=-Wall,-Wextra")
    # The CPU optimizer's loops vectorise only without errno from sqrtf; no contraction into FMAs, so its AVX-512 /
    # AVX2 / baseline clones give the scalar formula's bits. (MSVC: /fp:precise, its default, neither sets errno in
    # vector code nor contracts.)
    list(APPEND optim -fno-math-errno -ffp-contract=off)
    if(sanitize OR fuzz)
      # One sanitizer an option: nvcc splits -Xcompiler's argument at every comma.
      set(san -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g)
      list(APPEND cxx ${san})
      string(REPLACE ";" "," san_x "${san}")
      list(APPEND cuda "-Xcompiler=${san_x}")
      list(APPEND link -fsanitize=address,undefined)
    endif()
    if(fuzz)
      list(APPEND cxx -fsanitize=fuzzer-no-link)
    endif()
  else()
    message(FATAL_ERROR "zerorun_compile_flags: style '${style}' is neither MSVC nor GNU")
  endif()
  set(ZR_CXX_OPTIONS "${cxx}" PARENT_SCOPE)
  set(ZR_CUDA_OPTIONS "${cuda}" PARENT_SCOPE)
  set(ZR_DEFINITIONS "${defs}" PARENT_SCOPE)
  set(ZR_LINK_OPTIONS "${link}" PARENT_SCOPE)
  set(ZR_OPTIM_OPTIONS "${optim}" PARENT_SCOPE)
endfunction()
