"""Packaging: dist/ (our package) holds only sources, every package is typed (py.typed), and
the build configuration ships them, with the entry points (dist.trainer's mains)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpuplan", "autograd", "dist", "benchsuite")
# What a package folder may hold: Python, the CUDA/C++ sources it compiles, the type marker.
SOURCE_SUFFIXES = {".py", ".cu", ".cuh", ".h", ".cpp", ".typed"}


def test_dist_folder_holds_only_package_sources():
    """`python -m build` (and pip wheel -w dist) default to ./dist, which is our package:
    a stray wheel or sdist there would be shipped inside the next wheel."""
    tracked = subprocess.run(["git", "ls-files", "dist"], cwd=ROOT, capture_output=True,
                             text=True)
    files = [p for p in (ROOT / "dist").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    strays = [str(p.relative_to(ROOT)) for p in files if p.suffix not in SOURCE_SUFFIXES]
    assert not strays, (f"not package sources in dist/: {strays} (build wheels with "
                        f"`python -m build --outdir wheelhouse`)")
    if tracked.returncode == 0:  # a git checkout: the package's own files are there
        assert "dist/__init__.py" in tracked.stdout.split()


def test_every_package_is_typed_and_listed_for_the_wheel():
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").is_file(), package
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"py.typed"' in pyproject
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    scripts = tomllib.loads(pyproject)["project"]["scripts"]
    assert set(scripts) == {"gpuplan-train", "gpuplan-generate", "gpuplan-export"}
    for target in scripts.values():  # "dist.trainer.main:main" -> dist/trainer/main.py
        module, func = target.split(":")
        assert module.startswith("dist.trainer.") and func == "main", target
        source = ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text()
        assert f"def {func}(" in source, target
    for name in ("train", "generate", "export"):  # the checkout's entry scripts run the same
        source = (ROOT / "scripts" / f"{name}.py").read_text()
        assert f"from {scripts[f'gpuplan-{name}'].replace(':', ' import ')}\n" in source, name
    setup = (ROOT / "setup.py").read_text()
    # dist.trainer and benchsuite ship
    assert 'include=["gpuplan*", "autograd*", "dist*", "benchsuite*"]' in setup


def test_the_license_is_an_spdx_string_so_builds_print_no_deprecation_warning():
    """Before: `license = { text = ... }` made setuptools (>= 77) print its deprecation
    warning four times per install."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in config["build-system"]["requires"]
