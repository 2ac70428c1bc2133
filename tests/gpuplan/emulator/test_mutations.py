"""Mutation tests of the emulated device: copies of the real kernels with one planted bug must
fail when the real plan runs them on the emulated device (a KernelFault, or a result outside
the dtype's tolerance of a float64 reference), while the unmodified copy passes.

Each mutation names the file, a region of it (from a marker to an end marker) and a regular
expression that must match exactly once inside that region: a refactor of the kernel makes
these tests fail loudly instead of silently mutating nothing. The mutated copy (with the
other local headers beside it) is built by gpuplan.emulator.EmulatedModule with the family's
own name_expressions and options, and the family's ``_MODULE`` is monkeypatched with a
stand-in that hands the plan the mutated kernels.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import bfloat16, float16, float32
from gpuplan.emulator import DEVICE_ID, EmulatedModule, KernelFault
from gpuplan.emulator.build import local_sources
from gpuplan.nvrtc import INCLUDE_DIR
from gpuplan.ops.gemm import plans as gemm_family
from gpuplan.ops.normalization import plans as norm_family
from gpuplan.ops.normalization.reference import layer_norm_reference
from gpuplan.testing import random, tol

# -- mutations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """Replace the one match of `pattern` between `start` and the first `end` after it."""

    file: str      # a file of gpuplan/ops: the family's .cu or a header it includes
    start: str     # marker (exact text, occurring once in the file) opening the region
    end: str       # exact text closing the region (its first occurrence after `start`)
    pattern: str   # regular expression, matching exactly once in the region
    repl: str      # re.sub replacement

    def apply(self, text: str) -> str:
        n_start = text.count(self.start)
        assert n_start == 1, (f"{self.file}: the region marker {self.start!r} occurs "
                              f"{n_start} times (expected once): the kernel changed, update "
                              f"the mutation")
        lo = text.index(self.start)
        hi = text.find(self.end, lo + len(self.start))
        assert hi > lo, f"{self.file}: no {self.end!r} after {self.start!r}"
        region = text[lo:hi]
        hits = len(re.findall(self.pattern, region))
        assert hits == 1, (f"{self.file}: {self.pattern!r} matches {hits} times between "
                           f"{self.start!r} and {self.end!r} (expected once): the kernel "
                           f"changed, update the mutation")
        mutated = re.sub(self.pattern, self.repl, region, count=1)
        assert mutated != region
        return text[:lo] + mutated + text[hi:]


GEMM_TC = ("__global__ void __launch_bounds__(tc::THREADS", "// CUDA-core kernel")
GEMM_FMA = ("gemm_fma(const T* __restrict__ A", "gemm_scale_bias")

MUTATIONS: dict[str, Mutation] = {
    # gemm_tc: the barrier that makes every thread's cp.async copies of k-tile kt visible
    "tc-no-sync-after-wait": Mutation(
        "gemm.cu", *GEMM_TC, r"(cp_async_wait<STAGES - 2>\(\);[^\n]*\n\s*)__syncthreads\(\);",
        r"\1/* MUTANT: no barrier */"),
    # gemm_tc: wait_group lets one group too many stay in flight (k-tile kt not landed)
    "tc-wait-group-too-little": Mutation(
        "gemm.cu", *GEMM_TC, r"cp_async_wait<STAGES - 2>\(\);", "cp_async_wait<STAGES - 1>();"),
    # ldmatrix row address of A off by one (k-contiguous A: the non-transposed path) ...
    "tc-ldmatrix-row-a-kc": Mutation(
        "gemm.cu", "a_lane_offset(int lane, int wm0) {", "\n}",
        r"\(q & 1\) \* 8 \+ r,", "(q & 1) * 8 + ((r + 1) & 7),"),
    # ... and of a row-contiguous A (trans_a: rows of the ldmatrix are k)
    "tc-ldmatrix-row-a-rc": Mutation(
        "gemm.cu", "a_lane_offset(int lane, int wm0) {", "\n}",
        r"\(q >> 1\) \* 8 \+ r\)", "(q >> 1) * 8 + ((r + 1) & 7))"),
    # the transposing ldmatrix loses .trans
    # (the wrapper lives in gpuplan_mma.cuh, shared by gemm.cu and the attention kernels)
    "tc-ldmatrix-trans-dropped": Mutation(
        "gpuplan_mma.cuh", "void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {", "\n}\n",
        r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
    # epilogue column bound off by one at the N edge of the tile
    "tc-epilogue-col-le-n": Mutation(
        "gemm.cu", *GEMM_TC, r"if \(col < Ni\)", "if (col <= Ni)"),
    # load_tile (VEC): the row bound of a cp.async chunk off by one (reads past the matrix)
    "tc-load-tile-row-le-rows": Mutation(
        "gemm.cu", "__device__ __forceinline__ void load_tile(", "} else {", r"gr < rows",
        "gr <= rows"),
    # gemm_tc: the k-tile load issued before the barrier that frees its stage (a
    # write-after-read race on shared memory; reads of every k-tile stay ordered)
    "tc-load-before-stage-free": Mutation(
        "gemm.cu", *GEMM_TC,
        r"__syncthreads\(\);([^\n]*\n)(\s*if \(kt \+ STAGES - 1 < nk\) "
        r"load_stage\(kt \+ STAGES - 1\);\s*cp_async_commit\(\);)",
        r"\2 __syncthreads(); /* MUTANT: barrier moved below the load */\1"),
    # gemm_fma: the barrier between the prologue's shared stores and the first k-tile
    "fma-no-sync-after-prologue": Mutation(
        "gemm.cu", *GEMM_FMA, r"(Bs\[0\], rb, tid\);\s*\}\s*)__syncthreads\(\);",
        r"\1/* MUTANT: no barrier */"),
    # gemm_fma: the k-loop barrier between filling buffer buf ^ 1 and reading it
    "fma-no-sync-in-k-loop": Mutation(
        "gemm.cu", *GEMM_FMA, r"(Bs\[buf \^ 1\], rb, tid\);\s*\}\s*)__syncthreads\(\);",
        r"\1/* MUTANT: no barrier */"),
    # gp::block_sum: the barrier between the per-warp partial sums and their reduction
    "block-sum-no-sync-after-partials": Mutation(
        "gpuplan_common.cuh", "__device__ A block_sum(A v, A* smem) {", "\n}\n",
        r"(if \(lane == 0\) smem\[wid\] = v;\s*)__syncthreads\(\);",
        r"\1/* MUTANT: no barrier */"),
    # gp::block_sum: the barrier between thread 0's total and everyone reading it
    "block-sum-no-sync-before-broadcast": Mutation(
        "gpuplan_common.cuh", "__device__ A block_sum(A v, A* smem) {", "\n}\n",
        r"(if \(threadIdx\.x == 0\) smem\[0\] = t;\s*)__syncthreads\(\);",
        r"\1/* MUTANT: no barrier */"),
    # gp::block_sum: the barrier keeping the partial-sum stores from overwriting smem[0]
    # while other threads still read the previous block_sum's result from it (write after read)
    "block-sum-no-sync-before-partials": Mutation(
        "gpuplan_common.cuh", "__device__ A block_sum(A v, A* smem) {", "\n}\n",
        r"(v = warp_sum\(v\);\s*)__syncthreads\(\);", r"\1/* MUTANT: no barrier */"),
}


# -- building mutated modules and handing them to the plans ---------------------------------

#: Built modules, kept alive for the session (gemm.py remembers kernels by id()).
_BUILT: dict[tuple[str, str | None], EmulatedModule] = {}


def build_variant(family: Any, mutation_id: str | None, tmp_dir: Path) -> EmulatedModule:
    """The family's .cu with `mutation_id` applied (None: unmodified), built for the emulated
    device from a copy in tmp_dir with every local header beside it."""
    key = (family.__name__, mutation_id)
    if key in _BUILT:
        return _BUILT[key]
    real = family._MODULE
    for p in [real.path, *INCLUDE_DIR.glob("*.cuh")]:
        shutil.copy(p, tmp_dir / p.name)
    if mutation_id is not None:
        m = MUTATIONS[mutation_id]
        target = tmp_dir / m.file
        assert target.is_file(), f"{m.file} is not beside {real.path.name}"
        target.write_text(m.apply(target.read_text()))
    path = tmp_dir / real.path.name
    include_dirs = [Path(o[2:]) for o in real.options if o.startswith("-I")]
    used = local_sources(path, include_dirs)
    assert all(p.parent == tmp_dir for p in used.values()), used  # the copies, not the originals
    if mutation_id is not None:
        assert MUTATIONS[mutation_id].file in used, f"{real.path.name} does not include it"
    module = _BUILT[key] = EmulatedModule(path, real.name_expressions, real.options)
    return module


class StandInModule:
    """What the plans use of a family's CudaModule, serving the kernels of `module`."""

    def __init__(self, real: Any, module: EmulatedModule) -> None:
        self.path = module.path
        self.name_expressions = real.name_expressions
        self.options = real.options
        self._module = module
        self.launched: list[str] = []

    def function(self, name_expression: str, device_id: int) -> Any:
        assert device_id == DEVICE_ID, "the mutation tests run on the emulated device only"
        if name_expression not in self.name_expressions:
            raise KeyError(f"{self.path.name}: kernel {name_expression!r} is not among the "
                           "declared name_expressions")
        self.launched.append(name_expression)
        return self._module.get_function(name_expression)


def dev(a: np.ndarray) -> Any:
    return gp.to_device(np.ascontiguousarray(a), "emulated")


def f64(a: Any) -> np.ndarray:
    return np.asarray(gp.to_host(a)).astype(np.float64)


# -- the problems ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    checks: list[tuple[str, np.ndarray, np.ndarray, float, float]]  # name, got, ref, rtol, atol


def run_gemm(dtype: Any, m: int, n: int, k: int, trans_a: bool = False,
             trans_b: bool = False) -> Outcome:
    desc = gp.GemmDescriptor(m, n, k, trans_a=trans_a, trans_b=trans_b, broadcast_a=True,
                             broadcast_b=True, dtype=dtype)
    a = random(desc.a_shape(), dtype, seed=1)
    b = random(desc.b_shape(), dtype, seed=2)
    c = dev(np.full(desc.c_shape(), np.nan, dtype=dtype))
    stream = gp.Stream.emulated()
    plan = gp.GemmPlan.select(stream, desc)
    assert plan.sku().backend == gp.BackendKind.NVRTC, plan.sku()
    plan.run(stream, gp.Workspace.allocate(stream, plan.workspace_size()),
             gp.GemmArgs(dev(a), dev(b), c))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    rtol, atol = tol(dtype, scale=2)
    return Outcome([("c", f64(c), ref, rtol, atol)])


def run_layer_norm(dtype: Any, rows: int, dim: int) -> Outcome:
    x = random((rows, dim), dtype, seed=3) * 2 + np.linspace(-1, 1, rows)[:, None]
    x = x.astype(dtype)
    w, bias = random((dim,), dtype, seed=4), random((dim,), dtype, seed=5)
    y, mean, rstd = gp.functional.layer_norm(dev(x), dev(w), dev(bias), eps=1e-5)
    ry, rmean, rrstd = layer_norm_reference(x, w, bias, 1e-5)
    rtol, atol = tol(dtype, scale=4)
    return Outcome([("y", f64(y), ry, rtol, atol), ("mean", f64(mean), rmean, rtol, atol),
                    ("rstd", f64(rstd), rrstd, rtol, atol)])


@dataclass(frozen=True)
class Problem:
    family: Any
    run: Callable[[], Outcome]
    kernel: str  # the instance the plan must launch (the path the mutation is on)


BF16, F16 = "__nv_bfloat16", "__half"
# GEMM 40 x 72 x 48: one 128 x 128 tile with M and N edges; K and N multiples of 8 and
# 16-byte aligned operands, so the cp.async (VEC) path of gemm_tc is taken.
PROBLEMS: dict[str, Problem] = {
    "gemm-bf16-nn": Problem(gemm_family, lambda: run_gemm(bfloat16, 40, 72, 48),
                            f"gemm::gemm_tc<{BF16}, false, false, true, -1>"),
    "gemm-f16-nn": Problem(gemm_family, lambda: run_gemm(float16, 40, 72, 48),
                           f"gemm::gemm_tc<{F16}, false, false, true, -1>"),
    "gemm-bf16-tn": Problem(gemm_family, lambda: run_gemm(bfloat16, 40, 72, 48, trans_a=True),
                            f"gemm::gemm_tc<{BF16}, true, false, true, -1>"),
    "gemm-bf16-nt": Problem(gemm_family, lambda: run_gemm(bfloat16, 40, 72, 48, trans_b=True),
                            f"gemm::gemm_tc<{BF16}, false, true, true, -1>"),
    # K = 160: five k-tiles, more than the pipeline's STAGES - 1 = 3 in flight
    "gemm-bf16-nn-k160": Problem(gemm_family, lambda: run_gemm(bfloat16, 40, 72, 160),
                                 f"gemm::gemm_tc<{BF16}, false, false, true, -1>"),
    "gemm-f32-nn": Problem(gemm_family, lambda: run_gemm(float32, 40, 72, 48),
                           "gemm::gemm_fma<float, false, false, 128, 128, 8, 8, -1>"),
    # dim 2048 > WARP_ROW_MAX_DIM: the block-per-row kernel, whose row sums are gp::block_sum
    "layer-norm-f32-block-row": Problem(norm_family, lambda: run_layer_norm(float32, 3, 2048),
                                        "norm_forward<float, false, false>"),
}

class MutantSurvived(AssertionError):
    """A mutant ran without a fault and within tolerance: the emulator missed the bug."""


def mutant(mutation_id: str, problem_id: str, *marks: Any) -> Any:
    return pytest.param(mutation_id, problem_id, id=mutation_id, marks=marks)


#: Write-after-read races are caught two ways: the scheduler lets one warp run ahead of
#: others, and the shared-memory race check counts a cp.async destination as written at
#: issue (tc-load-before-stage-free, block-sum-no-sync-before-partials).
MUTANTS = [
    mutant("tc-no-sync-after-wait", "gemm-bf16-nn"),
    mutant("tc-wait-group-too-little", "gemm-bf16-nn-k160"),
    mutant("tc-ldmatrix-row-a-kc", "gemm-bf16-nn"),
    mutant("tc-ldmatrix-row-a-rc", "gemm-bf16-tn"),
    mutant("tc-ldmatrix-trans-dropped", "gemm-bf16-tn"),
    mutant("tc-epilogue-col-le-n", "gemm-f16-nn"),
    mutant("tc-load-tile-row-le-rows", "gemm-bf16-nn"),
    mutant("fma-no-sync-in-k-loop", "gemm-f32-nn"),
    mutant("fma-no-sync-after-prologue", "gemm-f32-nn"),
    mutant("block-sum-no-sync-after-partials", "layer-norm-f32-block-row"),
    mutant("block-sum-no-sync-before-broadcast", "layer-norm-f32-block-row"),
    mutant("tc-load-before-stage-free", "gemm-bf16-nn-k160"),
    mutant("block-sum-no-sync-before-partials", "layer-norm-f32-block-row"),
]


def run_with(problem: Problem, mutation_id: str | None, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Outcome | KernelFault:
    """Run `problem` through the real plan on the (mutated) copy: its Outcome, or the fault."""
    module = build_variant(problem.family, mutation_id, tmp_path)
    stand_in = StandInModule(problem.family._MODULE, module)
    monkeypatch.setattr(problem.family, "_MODULE", stand_in)
    try:
        result: Outcome | KernelFault = problem.run()
    except KernelFault as exc:
        result = exc
    assert problem.kernel in stand_in.launched, (
        f"the plan launched {stand_in.launched}, not {problem.kernel}: the mutated path was "
        "not exercised")
    return result


@pytest.mark.parametrize("problem_id", list(PROBLEMS))
def test_unmodified_copy_passes(problem_id, tmp_path, monkeypatch):
    """Control: the copy built the same way, with no mutation, matches the reference."""
    outcome = run_with(PROBLEMS[problem_id], None, tmp_path, monkeypatch)
    if isinstance(outcome, KernelFault):
        raise outcome
    for name, got, ref, rtol, atol in outcome.checks:
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("mutation_id,problem_id", MUTANTS)
def test_mutant_fails(mutation_id, problem_id, tmp_path, monkeypatch):
    outcome = run_with(PROBLEMS[problem_id], mutation_id, tmp_path, monkeypatch)
    if isinstance(outcome, KernelFault):
        assert "kernel " in str(outcome)  # a fault names the kernel, block and thread
        return
    wrong = [name for name, got, ref, rtol, atol in outcome.checks
             if not np.allclose(got, ref, rtol=rtol, atol=atol)]
    if not wrong:
        raise MutantSurvived(f"mutant {mutation_id} ran on {problem_id} without a fault and "
                             "within tolerance: the emulator missed this bug")
