"""The emulator's build cache under concurrent builders: processes (MPI ranks, test workers)
asking for the same library at once compile it once; the others wait and take the result."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpuplan.emulator import build

KERNEL = 'extern "C" __global__ void fill_one(float* x) { x[0] = 1.0f; }\n'


def _fake_compiler(calls: list[str]):
    """Stands for the C++ compiler: records the step, takes a while (so builders overlap),
    writes the file named after -o."""
    def run(cmd, what):
        calls.append(what)
        time.sleep(0.3)
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"\x7fELF stand-in")
    return run


def test_concurrent_builders_of_one_module_compile_it_once(tmp_path, monkeypatch):
    src = tmp_path / "fill.cu"
    src.write_text(KERNEL)
    monkeypatch.setenv("GPUPLAN_EMULATOR_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    monkeypatch.setattr(build, "_run", _fake_compiler(calls))
    results: list[Path] = []
    errors: list[BaseException] = []

    def builder():
        try:
            results.append(build.build_module(src, ["fill_one"], ()))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=builder) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 4 and len(set(results)) == 1 and results[0].is_file()
    # one compile and one link in all, not one pair per builder
    assert len(calls) == 2, calls
    assert calls[0].startswith("compiling fill.cu") and calls[1].startswith("linking fill.cu")


def test_a_waiting_builder_takes_the_published_library(tmp_path, monkeypatch):
    src = tmp_path / "fill.cu"
    src.write_text(KERNEL)
    monkeypatch.setenv("GPUPLAN_EMULATOR_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    monkeypatch.setattr(build, "_run", _fake_compiler(calls))
    first = build.build_module(src, ["fill_one"], ())
    again = build.build_module(src, ["fill_one"], ())
    assert first == again and len(calls) == 2
    # another instance list is another library: built anew
    other = build.build_module(src, ["fill_one", "fill_one"], ())
    assert other != first and len(calls) == 4
