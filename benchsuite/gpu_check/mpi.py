"""MPI for the GPU check: the machine's own when `from mpi4py import MPI` works; else a
carried `mpich` wheel (`.carry/mpich-*.whl`) unpacked into the work folder, whose mpiexec and
libmpi then go on PATH and LD_LIBRARY_PATH of every later command. No registry is needed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from benchsuite.gpu_check.orchestrator import ROOT, Check, Result

NO_MPIEXEC = "no mpiexec (and no carried .carry/mpich-*.whl to install one)"


def carried_mpich_wheel(root: Path = ROOT) -> Path | None:
    """The newest `.carry/mpich-*.whl` (not PyPI's empty `mpich-0.0.0` placeholder)."""
    wheels = [w for w in root.glob(".carry/mpich-*.whl") if not w.name.startswith("mpich-0.0.0")]

    def version(w: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", w.name.split("-")[1])[:4])

    return max(wheels, key=version) if wheels else None


def install_carried_mpich(check: Check, result: Result) -> bool:
    """Unpack the carried mpich wheel into WORK/site (pip, no index, no dependencies) and put
    its bin/ and lib/ on the check's PATH and LD_LIBRARY_PATH. False when there is none or
    it does not install."""
    wheel = carried_mpich_wheel()
    if wheel is None:
        return False
    site = check.work / "site"
    fin = check.command(result, [check.python, "-m", "pip", "install", "--no-index", "--no-deps",
                                 "--disable-pip-version-check", "--target", str(site),
                                 str(wheel)], cap=120, name="env")
    if fin.rc != 0:
        return False
    bins = [p.parent for p in site.rglob("mpiexec")]
    libs = {p.parent for p in site.rglob("libmpi.so*")}
    for var, dirs in (("PATH", bins[:1]), ("LD_LIBRARY_PATH", sorted(libs))):
        if dirs:
            check.env[var] = os.pathsep.join([*map(str, dirs), check.env.get(var, "")]).rstrip(
                os.pathsep)
    result.note(f"installed {wheel.name} into the work folder")
    return bool(bins)


def mpiexec(env: dict[str, str]) -> str | None:
    return shutil.which("mpiexec", path=env.get("PATH"))


def launcher(env: dict[str, str], n: int) -> list[str] | None:
    """`mpiexec -n n` (Open MPI also gets --oversubscribe, and root permission as root)."""
    exe = mpiexec(env)
    if exe is None:
        return None
    cmd = [exe, "-n", str(n)]
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, env=env,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd
