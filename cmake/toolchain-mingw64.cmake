# Cross-building zerorun.exe for 64-bit Windows with Debian's MinGW-w64 (g++-mingw-w64-x86-64-posix: the posix
# thread model, which std::thread and OpenMP need). Used by tests/windows/build_windows.sh; tests run under wine.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(ZR_MINGW x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${ZR_MINGW}-gcc-posix)
set(CMAKE_CXX_COMPILER ${ZR_MINGW}-g++-posix)
set(CMAKE_RC_COMPILER ${ZR_MINGW}-windres)
set(CMAKE_FIND_ROOT_PATH /usr/${ZR_MINGW})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# One self-contained .exe: libstdc++, libgcc, winpthread and libgomp linked in, no MinGW DLLs to ship.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_CROSSCOMPILING_EMULATOR wine)
set(CMAKE_FIND_LIBRARY_SUFFIXES .a)  # static libraries only (libgomp.a, not libgomp.dll.a): no DLLs to ship
