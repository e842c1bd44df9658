#!/usr/bin/env python3
"""The grep half of tests/windows/msvc_proxy_check.sh (issue 36): fails on constructs that GCC and Clang accept but
MSVC (cl.exe, and nvcc's host pass through cl.exe) does not, in every source the Windows build compiles.

Comments and string literals are blanked first (a message may name setenv); code inside a preprocessor block whose
condition names a compiler or platform macro (__GNUC__, _MSC_VER, _WIN32, __linux__, ZR_HAVE_URING, ...) is that
compiler's or platform's own and is not checked: that is how a helper keeps a builtin behind a guard.

Usage: msvc_constructs.py ROOT   (prints one line a hit, exit 1 when there is any)
"""
import pathlib
import re
import sys

# Scanned: what the Windows build compiles (the library, the CLI, the CUDA host code, the tests, the example).
SCAN_DIRS = ["src", "kernels", "include", "tests", "examples"]
SUFFIXES = {".cc", ".h", ".cu", ".cuh"}

# Exempt files, whole: the platform layer's two implementations (each compiled only on its own platform; Win32's
# includes <sys/stat.h>, which MSVC ships) and test sources that only ever build on Linux. Keep this list short:
# a new POSIX call belongs in the platform layer (include/zerorun/platform.h), not here.
EXEMPT = {
    "src/core/platform_posix.cc": "the POSIX implementation of the platform layer",
    "src/core/platform_win32.cc": "the Win32 implementation of the platform layer",
    "tests/fuzz/libfuzzer_main.cc": "clang's libFuzzer entry (-DZERORUN_FUZZ=ON, Linux only)",
}

# Rules a file may break, by name: the platform layer's header declares the layer's own glob(), ...
RULE_EXEMPT = {"include/zerorun/platform.h": {"posix-call"}}

# A #if / #ifdef naming one of these guards its block (and the #elif / #else branches of the same chain).
GUARD_MACROS = re.compile(
    r"\b(__GNUC__|__clang__|_MSC_VER|_WIN32|_WIN64|__MINGW32__|__MINGW64__|__linux__|__unix__|__APPLE__|"
    r"__x86_64__|__aarch64__|_M_X64|_M_IX86|_M_ARM64|__CUDACC__|__CUDA_ARCH__|ZR_HAVE_URING|__has_builtin|"
    r"__has_attribute|__has_include)\b")

# Not a member (x.f, x->f) or a namespace's (ns::f): a bare or ::-qualified name.
FREE = r"(?:(?<![\w.>:])|(?<=[^\w>]::)|(?<=^::))"
POSIX_HEADERS = r"(unistd|dlfcn|execinfo|glob|pthread|poll|termios|pwd|grp|libgen|strings|syslog|spawn|dirent)\.h"
# (name, pattern, why). Patterns see code with comments and string literals blanked.
RULES = [
    ("posix-header", re.compile(r"#\s*include\s*<(" + POSIX_HEADERS + r"|(sys|arpa|netinet|net)/[\w/]+\.h)>"),
     "a POSIX-only header: put the call behind include/zerorun/platform.h"),
    ("ssize_t", re.compile(r"\bssize_t\b"), "ssize_t is POSIX (use int64_t / std::ptrdiff_t)"),
    ("__VERSION__", re.compile(r"\b__VERSION__\b"), "__VERSION__ is GCC's and Clang's (CMake passes the compiler)"),
    ("M_PI", re.compile(r"\bM_(PI|PI_2|PI_4|1_PI|2_PI|2_SQRTPI|E|LOG2E|LOG10E|LN2|LN10|SQRT2|SQRT1_2)\b"),
     "the M_* constants are POSIX (MSVC needs _USE_MATH_DEFINES): write the constant"),
    ("setenv", re.compile(FREE + r"(setenv|unsetenv|putenv)\s*\("),
     "setenv/unsetenv are POSIX: platform::set_env / unset_env"),
    ("posix-call", re.compile(FREE +
        r"(fork|execvp|execv|execl|execlp|waitpid|getpid|getppid|geteuid|getuid|kill|sigaction|pipe|"
        r"dup2|fsync|readlink|mkdtemp|mkstemp|glob|getrusage|strsignal|posix_memalign|gmtime_r|localtime_r|usleep|"
        r"sleep|gethostname|popen|pclose|alloca|strcasecmp|strncasecmp|strtok_r|realpath|isatty|sysconf|mmap|"
        r"munmap|pread|pwrite|dlopen|dlsym|dlclose|dlerror|dladdr)\s*\("),
     "a POSIX-only call: it belongs in the platform layer"),
    ("__attribute__", re.compile(r"\b__attribute__\b"), "GCC/Clang only: behind #if defined(__GNUC__)"),
    ("__builtin_", re.compile(r"\b__builtin_\w+"), "GCC/Clang only: a helper behind #if defined(__GNUC__)"),
    ("__int128", re.compile(r"\b__int128\b"), "GCC/Clang only"),
    ("omp-collapse", re.compile(r"#\s*pragma\s+omp\b.*\bcollapse\s*\("),
     "collapse is OpenMP 3.0 (MSVC /openmp is 2.0): one loop over the product index"),
    ("omp-simd", re.compile(r"#\s*pragma\s+omp\b.*\bsimd\b"),
     "simd is OpenMP 4.0 (MSVC /openmp is 2.0): drop it or use a guarded _Pragma macro"),
    ("omp-task", re.compile(r"#\s*pragma\s+omp\s+(task|taskloop|taskwait|taskgroup)\b"), "tasks are OpenMP 3.0+"),
    ("omp-minmax", re.compile(r"#\s*pragma\s+omp\b.*\breduction\s*\(\s*(min|max)\s*:"),
     "min/max reductions are OpenMP 3.1"),
]
RESTRICT = ("__restrict__", re.compile(r"\b__restrict__\b"), "GNU spelling: __restrict (MSVC, GCC, Clang)")
# UTF-8 paths (src/, kernels/, include/; not the platform layer, and not tests/, whose temporary files are ASCII): a
# std::string path opened or handed to std::filesystem as is reads in the ANSI code page on Windows, so a non-ASCII
# name is not found or is created mangled. platform::to_path(p) in, platform::generic_path(p) out.
UTF8_SCOPE = ("src/", "kernels/", "include/")
FS_CALLS = (r"(exists|is_directory|is_regular_file|file_size|create_directories|create_directory|remove|remove_all|"
            r"rename|copy_file|directory_iterator|recursive_directory_iterator|absolute|canonical|weakly_canonical|"
            r"status|last_write_time|resize_file|space)")
UTF8_RULES = [
    ("utf8-stream", re.compile(r"\b(std::)?(i|o)?fstream\s*(\w+\s*)?[({]\s*(?!platform::to_path\(|[)}])"),
     "a stream opened by a std::string path: std::ifstream in(platform::to_path(path), ...)"),
    ("utf8-fopen", re.compile(r"(?:\bstd::|" + FREE + r")(fopen|freopen)\s*\("),
     "fopen takes an ANSI path on Windows: std::ifstream / std::ofstream with platform::to_path(path)"),
    ("utf8-path", re.compile(r"\b(fs|std::filesystem)::path\s*\(\s*(?![\")])"),
     "fs::path(std::string) reads it in the ANSI code page on Windows: platform::to_path(s)"),
    ("utf8-string", re.compile(r"\.string\(\)"),
     "path::string() is the ANSI code page on Windows (and backslashes): platform::generic_path(p)"),
    ("utf8-fs-call", re.compile(r"\b(fs|std::filesystem)::" + FS_CALLS + r"\s*\(\s*[\w.]+\s*\+"),
     "a std::string built into a std::filesystem call: platform::to_path(...)"),
]
STREAM_OPEN = re.compile(r"\.open\s*\(\s*(?!platform::to_path\()")
FS_CALL_ARG = re.compile(r"\b(fs|std::filesystem)::" + FS_CALLS + r"\s*\(\s*(\w+)\s*[,)]")
# A variable's type, from its nearest declaration above the use: a std::string, or a path (or auto).
DECL = re.compile(r"\b(std::string|fs::path|std::filesystem::path|auto)\s*&?\s*(\w+)\s*[=;,){(:]")
OMP_FOR = re.compile(r"#\s*pragma\s+omp\s+(parallel\s+)?for\b")
UNSIGNED_FOR = re.compile(r"^\s*for\s*\(\s*(const\s+)?(std::)?(size_t|unsigned\b|uint\w*|auto\b)")


def blank_comments_and_strings(text):
    """The text with comments and string/char literal contents replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check_file(path, rel):
    hits = []
    raw = path.read_text(encoding="utf-8", errors="replace")
    code = blank_comments_and_strings(raw).split("\n")
    rules = RULES + ([RESTRICT] if path.suffix in (".cc", ".h") else [])
    utf8 = rel.startswith(UTF8_SCOPE)
    if utf8:
        rules = rules + UTF8_RULES
    decls = {}  # name -> [(line, is a std::string)]
    if utf8:
        for ln, text in enumerate(code, 1):
            for m in DECL.finditer(text):
                decls.setdefault(m.group(2), []).append((ln, m.group(1) == "std::string"))

    def is_string_var(name, at):
        before = [is_str for ln, is_str in decls.get(name, []) if ln <= at]
        return bool(before) and before[-1]

    has_stream = "fstream" in raw
    stack = []  # per open #if: (guarded now, guarded by the chain's own conditions, guarded by its parent)
    pending_omp_for = None
    k = 0
    while k < len(code):
        line = code[k]
        lineno = k + 1
        while line.rstrip().endswith("\\") and k + 1 < len(code):  # a continued directive
            k += 1
            line = line.rstrip()[:-1] + " " + code[k]
        k += 1
        guarded = bool(stack) and stack[-1][0]
        d = re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)", line)
        if d:
            kind, cond = d.group(1), d.group(2)
            named = bool(GUARD_MACROS.search(cond))
            if kind in ("if", "ifdef", "ifndef"):
                stack.append((guarded or named, named, guarded))
            elif kind == "elif" and stack:
                _, chain, parent = stack[-1]
                stack[-1] = (parent or chain or named, chain or named, parent)
            elif kind == "endif" and stack:
                stack.pop()
            continue
        if pending_omp_for is not None and line.strip():
            if not guarded and UNSIGNED_FOR.search(line):
                hits.append((pending_omp_for, "omp-unsigned-index",
                             "OpenMP 2.0's for needs a signed loop variable (int64_t)"))
            pending_omp_for = None
        if guarded:
            continue
        for name, rx, why in rules:
            if name not in RULE_EXEMPT.get(rel, ()) and rx.search(line):
                hits.append((lineno, name, why))
        if utf8:
            if has_stream and STREAM_OPEN.search(line):
                hits.append((lineno, "utf8-stream", "a stream opened by a std::string path: .open(platform::to_path(p))"))
            for m in FS_CALL_ARG.finditer(line):
                if is_string_var(m.group(3), lineno):
                    hits.append((lineno, "utf8-fs-call",
                                 f"std::string '{m.group(3)}' handed to a std::filesystem call: platform::to_path()"))
        if OMP_FOR.search(line):
            pending_omp_for = lineno
    return [f"{rel}:{ln}: [{name}] {why}\n    {raw.split(chr(10))[ln - 1].strip()}" for ln, name, why in hits]


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    files = sorted(p for d in SCAN_DIRS for p in (root / d).rglob("*") if p.suffix in SUFFIXES and p.is_file())
    report, scanned = [], 0
    for p in files:
        rel = p.relative_to(root).as_posix()
        if rel in EXEMPT or "/__pycache__/" in rel:
            continue
        scanned += 1
        report += check_file(p, rel)
    for r in report:
        print(r)
    print(f"msvc constructs: {scanned} files scanned ({len(EXEMPT)} exempt), {len(report)} hit(s)")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
