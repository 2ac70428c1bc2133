"""Build step of the emulator: a kernel module's `.cu` source (and the local headers it
includes) compiled by the host C++ compiler into a shared library, cached on disk.

The source is the kernel file itself, transformed in two ways only (line count kept):
- inline PTX statements become calls of emulated instructions (`ptx.translate_source`);
- ``__shared__`` declarations become references into the block's emulated shared memory.
An entry table (one invoker per declared name expression) is appended. The translation
unit is compiled with ``-fsanitize=address,alignment`` in callback mode against no sanitizer
runtime: the emulator runtime defines the callbacks, bounds-checks every kernel memory access
and faults on an access misaligned for its type (as a GPU does).

The cache key covers the sources of the module and of every header it includes, the
emulator's own header and runtime, the compiler's version and the options.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gpuplan.emulator.ptx import UnknownInstruction, code_only, translate_source

HERE = Path(__file__).resolve().parent
RUNTIME_SOURCES = ("runtime.cpp", "emu_abi.h")
KERNEL_HEADERS = ("cuda_emu.h", "emu_abi.h")

#: Instrumentation: ASan's per-access callbacks (no shadow memory, no ASan runtime) for the
#: bounds checks, and UBSan's alignment check (the runtime's handler faults as a GPU would).
SANITIZE = ("-fsanitize=address,alignment", "--param=asan-instrumentation-with-call-threshold=0",
            "--param=asan-globals=0", "--param=asan-stack=0",
            "-fno-sanitize-address-use-after-scope")
OPT = ("-O1", "-g", "-fno-omit-frame-pointer")


class BuildError(RuntimeError):
    """The host compiler rejected an emulated module (its messages are included)."""


def cxx() -> str:
    return os.environ.get("GPUPLAN_EMULATOR_CXX") or os.environ.get("CXX") or "g++"


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    try:
        return subprocess.run([cxx(), "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as exc:
        raise BuildError(f"emulator: the host C++ compiler {cxx()!r} cannot be run ({exc}); "
                         "install g++ or set GPUPLAN_EMULATOR_CXX") from None


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """A folder with cuda_fp16.h / cuda_bf16.h / vector_types.h (the CUDA toolkit's)."""
    candidates = []
    if os.environ.get("GPUPLAN_CUDA_INCLUDE"):
        candidates.append(Path(os.environ["GPUPLAN_CUDA_INCLUDE"]))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        candidates += [real.parent.parent / "include", Path(nvcc).parent.parent / "include"]
    candidates.append(Path("/usr/local/cuda/include"))
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    candidates += [site / "cuda_runtime" / "include", site / "cu13" / "include",
                   site / "cu12" / "include"]
    for c in candidates:
        if (c / "cuda_fp16.h").is_file() and (c / "vector_types.h").is_file():
            return c
    raise BuildError("emulator: no CUDA headers (cuda_fp16.h, vector_types.h) found; set "
                     "GPUPLAN_CUDA_INCLUDE, CUDA_HOME, put nvcc on PATH or install the "
                     "nvidia-cuda-runtime wheel")


def cache_dir() -> Path:
    root = os.environ.get("GPUPLAN_EMULATOR_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuplan" / "emulator"


# -- source transformation -----------------------------------------------------------------

_SHARED_RE = re.compile(
    r"(?P<ext>\bextern\s+)?\b__shared__\s+(?P<align>__align__\s*\(\s*(?P<n>\d+)\s*\)\s+)?"
    r"(?P<type>[^;={}()]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\];]*\]\s*)*);")


def transform_shared(src: str, filename: str, site_base: int) -> tuple[str, int]:
    """Rewrite ``__shared__ T name[dims];`` into a reference to emulated shared memory.

    Static declarations get a site number (one allocation per block and site); ``extern
    __shared__ T name[];`` becomes a pointer to the launch's dynamic shared memory.
    Returns the new source and the number of sites used.
    """
    sites = 0
    out, pos = [], 0
    for m in _SHARED_RE.finditer(code_only(src)):  # comments and strings blanked
        typ, name, dims = m.group("type").strip(), m.group("name"), m.group("dims").strip()
        line = src.count("\n", 0, m.start()) + 1
        if not typ or "," in m.group(0):
            raise UnknownInstruction(f"{filename}:{line}: cannot emulate the __shared__ "
                                     f"declaration {m.group(0)!r} (one name per declaration)")
        align = int(m.group("n")) if m.group("n") else 0
        if m.group("ext"):
            if dims.replace(" ", "") != "[]":
                raise UnknownInstruction(f"{filename}:{line}: extern __shared__ must be an "
                                         f"unsized array")
            code = f"{typ}* const {name} = static_cast<{typ}*>(__emu_shared_dynamic());"
        else:
            alias = f"__emu_shared_t_{name}"
            al = f"alignof({alias})" if not align else f"({align} > alignof({alias}) ? " \
                 f"{align} : alignof({alias}))"
            code = (f"using {alias} = {typ}{dims}; {alias}& {name} = *static_cast<{alias}*>("
                    f"__emu_shared_static(sizeof({alias}), {al}, {site_base + sites}));")
            sites += 1
        out.append(src[pos:m.start()])
        out.append(code + "\n" * m.group(0).count("\n"))
        pos = m.end()
    out.append(src[pos:])
    return "".join(out), sites


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def local_sources(path: Path, include_dirs: Sequence[Path]) -> dict[str, Path]:
    """The .cu file and every quoted include found in its folder or `include_dirs`."""
    found: dict[str, Path] = {}
    todo = [path]
    while todo:
        p = todo.pop()
        if p.name in found:
            continue
        found[p.name] = p
        for inc in _INCLUDE_RE.findall(p.read_text()):
            for d in (p.parent, *include_dirs):
                if (d / inc).is_file():
                    todo.append(d / inc)
                    break
    return found


def _entry_table(name_expressions: Sequence[str]) -> str:
    rows = ",\n".join(f'    __EMU_ENTRY("{n}", {n})' for n in name_expressions)
    return (
        "\n// -- emulator entry table (generated) --\n"
        f"static const __emu_entry __emu_entries[] = {{\n{rows}\n}};\n"
        'extern "C" __attribute__((visibility("default"))) '
        "const __emu_entry* emu_module_entries(int* n) {\n"
        f"    *n = {len(name_expressions)};\n    return __emu_entries;\n}}\n")


def module_key(path: Path, name_expressions: Sequence[str], options: Sequence[str]) -> str:
    include_dirs = [Path(o[2:]) for o in options if o.startswith("-I")]
    h = hashlib.sha256()
    for name, p in sorted(local_sources(path, include_dirs).items()):
        h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    for name in (*KERNEL_HEADERS, "ptx.py", "build.py"):
        h.update((HERE / name).read_bytes())
    h.update("\0".join((compiler_version(), *name_expressions, *options, *OPT,
                        *SANITIZE)).encode())
    return h.hexdigest()[:24]


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        log = (proc.stdout + proc.stderr).strip()
        lines = log.splitlines()
        if len(lines) > 60:
            log = "\n".join(lines[:60] + [f"... ({len(lines) - 60} more lines)"])
        raise BuildError(f"emulator: {what} failed:\n{' '.join(cmd)}\n{log}")


@contextlib.contextmanager
def _building(dest: Path):
    """Hold an exclusive lock on `dest`'s lock file while building it: MPI ranks or test
    workers that ask for the same library at once wait for the first builder instead of
    each compiling it (the first build of a large module takes a minute on a 2-core
    machine). The builder publishes atomically either way; without fcntl (not POSIX) each
    builds, as before."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        yield
        return
    with open(dest.parent / f"{dest.name}.lock", "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _publish(tmp: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)  # atomic: concurrent builders (MPI ranks) never see a partial file


def build_runtime() -> Path:
    """The emulator runtime shared library (built once per cache folder and source)."""
    h = hashlib.sha256(compiler_version().encode())
    for name in RUNTIME_SOURCES:
        h.update((HERE / name).read_bytes())
    dest = cache_dir() / f"runtime-{h.hexdigest()[:24]}.so"
    if dest.is_file():
        return dest
    with _building(dest), tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        if dest.is_file():  # built by another process while this one waited
            return dest
        out = Path(tmp) / "runtime.so"
        _run([cxx(), "-std=c++17", "-O3", "-g", "-fPIC", "-shared", "-I", str(HERE),
              str(HERE / "runtime.cpp"), "-o", str(out)], "building the emulator runtime")
        _publish(out, dest)
    return dest


def build_module(path: Path, name_expressions: Sequence[str], options: Sequence[str]) -> Path:
    """Compile `path` for the emulated device; returns the cached shared library."""
    dest = cache_dir() / f"{path.stem}-{module_key(path, name_expressions, options)}.so"
    if dest.is_file():
        return dest
    include_dirs = [Path(o[2:]) for o in options if o.startswith("-I")]
    defines = [o for o in options if o.startswith(("-D", "-U"))]
    with _building(dest), tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        if dest.is_file():  # built by another process while this one waited
            return dest
        src_dir = Path(tmp)
        site = 0
        for name, p in local_sources(path, include_dirs).items():
            text = translate_source(p.read_text(), name)
            text, used = transform_shared(text, name, site)
            site += used
            if p == path:
                text += _entry_table(name_expressions)
            (src_dir / name).write_text(text)
        obj, lib = src_dir / "module.o", src_dir / "module.so"
        _run([cxx(), "-std=c++17", *OPT, *SANITIZE, "-fPIC", "-x", "c++",
              "-Wno-unknown-pragmas", "-include", str(HERE / "cuda_emu.h"),
              "-I", str(src_dir), "-I", str(HERE), "-isystem", str(cuda_include_dir()),
              *defines, "-c", str(src_dir / path.name), "-o", str(obj)],
             f"compiling {path.name} for the emulated device")
        _run([cxx(), "-shared", str(obj), "-o", str(lib)], f"linking {path.name}")
        _publish(lib, dest)
    return dest
