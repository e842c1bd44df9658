# Finds zerorun's dependencies (Debian packages) and, optionally, CUDA.
# ZERORUN_HEADER_DEPS: a folder holding the header-only dependencies (nlohmann/, spdlog/, fmt/, CLI/, catch2/) used
# as is: the Windows cross-build copies Debian's headers there (tests/windows/build_windows.sh); spdlog and fmt are
# then header-only.
set(ZERORUN_HEADER_DEPS "" CACHE PATH "folder of header-only dependencies instead of find_package")
if(ZERORUN_HEADER_DEPS)
  foreach(t nlohmann_json::nlohmann_json spdlog::spdlog CLI11::CLI11 Catch2::Catch2)
    add_library(${t} INTERFACE IMPORTED)
    set_target_properties(${t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${ZERORUN_HEADER_DEPS})
  endforeach()
  set_target_properties(spdlog::spdlog PROPERTIES INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY")
else()
  find_package(nlohmann_json 3.10 REQUIRED)
  find_package(spdlog REQUIRED)
  find_package(CLI11 REQUIRED)
endif()
find_package(OpenMP REQUIRED)
if(WIN32)
  # MS-MPI needs no SDK: src/comm/msmpi/mpi.h maps MPI onto msmpi.dll loaded at run time.
  add_library(MPI::MPI_CXX INTERFACE IMPORTED)
  set_target_properties(MPI::MPI_CXX PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/src/comm/msmpi)
  set(MPIEXEC_EXECUTABLE mpiexec)
  message(STATUS "zerorun: MS-MPI loaded at run time (msmpi.dll)")
else()
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()

# OpenBLAS provides cblas_sgemm; Debian installs cblas.h in the default path. ZERORUN_BUILTIN_GEMM links
# kernels/blas_builtin instead (portable, single-threaded per call, deterministic; slower): the Windows cross-build.
option(ZERORUN_BUILTIN_GEMM "Use zerorun's portable GEMM instead of OpenBLAS" OFF)
if(ZERORUN_BUILTIN_GEMM)
  include_directories(SYSTEM ${CMAKE_CURRENT_SOURCE_DIR}/kernels/blas_builtin)
  set(ZR_BLAS_LIBS "")
else()
  find_library(OPENBLAS_LIB NAMES openblas REQUIRED)
  find_path(OPENBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread REQUIRED)
  include_directories(SYSTEM ${OPENBLAS_INCLUDE})
  set(ZR_BLAS_LIBS ${OPENBLAS_LIB})
endif()

set(ZERORUN_HAVE_CUDA OFF)
if(ZERORUN_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(zr_pick_archs OFF)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(zr_pick_archs ON)
    endif()
    enable_language(CUDA)
    # The cards users have: Ampere (sm_80 A100, sm_86 RTX 30xx/A40), Ada (sm_89 RTX 40xx/L40), Hopper (sm_90), and
    # Blackwell (sm_100 B200, sm_120 RTX 50xx) where the toolkit has them (12.8+); the last as PTX too, so later
    # cards can JIT it. Only when the user gives none (-DCMAKE_CUDA_ARCHITECTURES=90 builds one, as CI does):
    # enable_language would fill in nvcc's own default, so whether one was given is asked before it.
    if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
      set(ZERORUN_CUDA_ARCH_LIST 80-real 86-real 89-real 90-real 100-real 120)
    else()
      set(ZERORUN_CUDA_ARCH_LIST 80-real 86-real 89-real 90)
    endif()
    if(zr_pick_archs)
      set(CMAKE_CUDA_ARCHITECTURES "${ZERORUN_CUDA_ARCH_LIST}" CACHE STRING "CUDA architectures" FORCE)
      set(CMAKE_CUDA_ARCHITECTURES "${ZERORUN_CUDA_ARCH_LIST}")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(ZERORUN_HAVE_CUDA ON)
    message(STATUS "zerorun: CUDA backend ON (${CMAKE_CUDA_COMPILER_VERSION}, arch ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "zerorun: no CUDA toolkit found, CPU-only build")
  endif()
endif()

# NVMe offload (src/zero/nvme.cc): io_uring through liburing (Debian: liburing-dev). Without it the "nvme" offload
# device is an error at run time naming the missing library.
if(NOT WIN32)
  find_library(URING_LIB NAMES uring)
  find_path(URING_INCLUDE liburing.h)
endif()
