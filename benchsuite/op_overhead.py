"""Autograd benchmarks: per-op overhead on tiny tensors and GPT training-step time.

    python scripts/bench_autograd.py                 # cuda if available, else cpu
    python scripts/bench_autograd.py --device cpu --gpt small
    python scripts/bench_autograd.py --device cuda --gpt gpt2 --dtype bf16
    python scripts/bench_autograd.py --stub-math         # Python overhead only (no kernels)
    python scripts/bench_autograd.py --calls             # Python calls per op and per step

With --stub-math every plan's kernel/NumPy body is replaced by a no-op that counts calls:
what remains is the Python cost of the plan layer (select from the cache, validation,
dispatch) and of autograd (tape recording, wrappers). It prints the cost per plan call, per
recorded autograd op, and PyTorch eager's per-op figure for the same tiny ops in the same
run. Outputs are uninitialised under the stub, so values (losses) are meaningless.

On the host the small-GPT step is also timed in PyTorch eager (same weights, same batch)
when torch is installed, and the two losses are compared.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable

import numpy as np

import autograd as ag
import gpuplan as gp
from autograd import nn, optim
from autograd.nn import functional as F

_EXECUTE = importlib.import_module("gpuplan.execute")  # gp.execute is the function

GPT_SHAPES = {
    # name: (config kwargs, batch, seq)
    "small": (dict(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=128), 8, 64),
    "gpt2": (dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768), 8, 1024),
}


def sync(device: str) -> None:
    if device == "cuda":
        gp.backend.synchronize()


def timeit(fn: Callable[[], object], device: str, repeat: int, warmup: int = 3) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_ops(device: str, repeat: int) -> None:
    """Per-op latency (forward only, and forward + backward) for 8x8 float32 tensors: this
    is the Python + plan-dispatch overhead, not kernel time."""
    rng = np.random.default_rng(0)

    def t(*shape):
        return ag.tensor(rng.standard_normal(shape).astype(np.float32), device=device,
                         requires_grad=True)

    a, b, w, bias = t(8, 8), t(8, 8), t(8, 8), t(8)
    idx = gp.to_device(rng.integers(0, 8, (8,)), device)
    target = gp.to_device(rng.integers(0, 8, (8,)), device)
    ops = {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "matmul": lambda: a @ b,
        "linear": lambda: F.linear(a, w, bias),
        "gelu": lambda: F.gelu(a),
        "softmax": lambda: F.softmax(a, dim=-1),
        "layer_norm": lambda: F.layer_norm(a, (8,), bias, bias),
        "sum": lambda: a.sum(),
        "reshape+transpose": lambda: a.reshape(4, 16).transpose(),
        "embedding": lambda: F.embedding(idx, w),
        "cross_entropy": lambda: F.cross_entropy(a, target),
    }
    print(f"\nper-op latency, 8x8 float32 on {device} (median of {repeat})")
    print(f"{'op':<20}{'forward us':>12}{'fwd+bwd us':>12}")
    for name, op in ops.items():
        with ag.no_grad():
            fwd = timeit(op, device, repeat)

        def fwd_bwd(op=op):
            out = op()
            (out if out.ndim == 0 else out.sum()).backward()
            for x in (a, b, w, bias):
                x.grad = None

        both = timeit(fwd_bwd, device, repeat)
        print(f"{name:<20}{fwd * 1e6:>12.1f}{both * 1e6:>12.1f}")


class MathStub:
    """Replace every plan's ``_run_<variant>`` by a counting no-op (see --stub-math)."""

    def __init__(self) -> None:
        self.calls = 0
        self._saved: list[tuple[type, str, object]] = []

    def __enter__(self) -> MathStub:
        def stub(plan, stream, ws, args):
            self.calls += 1

        todo = [gp.Plan]
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            for name, fn in list(vars(cls).items()):
                if name.startswith("_run_") and callable(fn):
                    self._saved.append((cls, name, fn))
                    setattr(cls, name, stub)
        _EXECUTE.clear_plan_cache()  # cached plans hold bound kernel bodies
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)
        _EXECUTE.clear_plan_cache()


def bench_overhead(device: str, repeat: int) -> None:
    """Python cost per plan call and per recorded autograd op, kernels stubbed out."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((8, 8)).astype(np.float32)
    x = gp.to_device(x_np, device)
    w = ag.tensor(x_np, device=device, requires_grad=True)
    bias = ag.tensor(x_np[0], device=device, requires_grad=True)
    idx = gp.to_device(rng.integers(0, 8, (8,)), device)
    plan_calls = {
        "gelu": lambda: gp.functional.unary("gelu", x),
        "add": lambda: gp.functional.binary("add", x, x),
        "matmul": lambda: gp.functional.matmul(x, x),
        "layer_norm": lambda: gp.functional.layer_norm(x, x[0], x[0], eps=1e-5),
        "softmax": lambda: gp.functional.softmax(x),
        "embedding": lambda: gp.functional.embedding(x, idx),
    }
    t = ag.tensor(x_np, device=device, requires_grad=True)
    autograd_ops = {
        "gelu": lambda: F.gelu(t),
        "add": lambda: t + t,
        "linear": lambda: F.linear(t, w, bias),
        "layer_norm": lambda: F.layer_norm(t, (8,), bias, bias),
        "softmax": lambda: F.softmax(t, dim=-1),
    }
    print(f"\nPython overhead on {device}, kernels stubbed (median of {repeat}, 8x8 f32)")
    print(f"{'call':<28}{'us':>8}{'plans':>7}{'us/plan':>9}")
    with MathStub() as stub:
        for group, calls in (("plan call", plan_calls), ("autograd fwd", autograd_ops)):
            for name, fn in calls.items():
                stub.calls = 0
                fn()
                n = stub.calls
                with ag.Tape():
                    sec = timeit(fn, device, repeat)
                print(f"{group + ' ' + name:<28}{sec * 1e6:>8.1f}{n:>7}"
                      f"{sec * 1e6 / max(n, 1):>9.1f}")
        cfg = nn.GPTConfig(**GPT_SHAPES["small"][0], seed=0)
        model = nn.GPT(cfg).to(device)
        opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        B, T = 2, 16
        ids = gp.to_device(rng.integers(0, cfg.vocab_size, (B, T)), device)
        step = gpt_step_fn(model, opt, ids, ids)
        step()
        stub.calls = 0
        step()
        n = stub.calls
        sec = timeit(step, device, max(repeat // 20, 5))
        print(f"{'GPT small step':<28}{sec * 1e6:>8.0f}{n:>7}{sec * 1e6 / n:>9.1f}")
        plans = len(_EXECUTE._PLANS)
        print(f"plans cached after the steps: {plans}")
    bench_torch_overhead(repeat)


def bench_torch_overhead(repeat: int) -> None:
    """PyTorch eager's per-op figure for the same 8x8 ops (CPU), for comparison."""
    try:
        import torch
    except ImportError:
        print("(torch not installed: no PyTorch per-op figure)")
        return
    g = torch.Generator().manual_seed(0)
    t = torch.randn(8, 8, generator=g, requires_grad=True)
    w = torch.randn(8, 8, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    ops = {
        "gelu": lambda: torch.nn.functional.gelu(t),
        "add": lambda: t + t,
        "linear": lambda: torch.nn.functional.linear(t, w, b),
        "layer_norm": lambda: torch.nn.functional.layer_norm(t, (8,), b, b),
        "softmax": lambda: torch.softmax(t, dim=-1),
    }
    print(f"PyTorch {torch.__version__} eager, CPU, recorded for autograd (8x8 f32, math "
          f"included)")
    for name, fn in ops.items():
        sec = timeit(fn, "cpu", repeat)
        print(f"{'torch fwd ' + name:<28}{sec * 1e6:>8.1f}")


def python_calls(fn: Callable[[], object]) -> int:
    """The Python function calls one `fn()` makes (sys.setprofile "call" events: functions
    written in Python, not C builtins)."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count - 1  # less fn's own frame


def bench_calls(device: str) -> None:
    """Python calls per recorded op (8x8 float32, inputs requiring grad, inside a tape) and
    per small-GPT training step (forward, backward, clip, AdamW, zero_grad), counted after a
    warm-up call (plans selected and cached)."""
    rng = np.random.default_rng(0)

    def t(*shape):
        return ag.tensor(rng.standard_normal(shape).astype(np.float32), device=device,
                         requires_grad=True)

    a, b = t(8, 8), t(8, 8)
    linear = nn.Linear(8, 8).to(device)
    ops = {"add": lambda: a + b, "nn.Linear": lambda: linear(a),
           "softmax": lambda: F.softmax(a, dim=-1),
           "layer_norm": lambda: F.layer_norm(a, (8,), b[0], b[0])}
    print(f"\nPython calls on {device} (8x8 float32, recorded on a tape)")
    with ag.Tape():
        for name, op in ops.items():
            op()
            print(f"{name:<28}{python_calls(op):>8}")
    cfg = nn.GPTConfig(**GPT_SHAPES["small"][0], seed=0)
    model = nn.GPT(cfg).to(device)
    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ids = gp.to_device(rng.integers(0, cfg.vocab_size, (2, 16)), device)
    step = gpt_step_fn(model, opt, ids, ids)
    step()
    print(f"{'GPT small step (2x16)':<28}{python_calls(step):>8}")


def gpt_step_fn(model: nn.GPT, opt: optim.Optimizer, idx, targets) -> Callable[[], float]:
    def step() -> float:
        loss = model.loss(idx, targets)
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def bench_gpt(device: str, shape: str, dtype: str, repeat: int) -> None:
    kwargs, B, T = GPT_SHAPES[shape]
    dt = gp.dtypes.as_dtype(dtype)
    cfg = nn.GPTConfig(**kwargs, dtype=dt, seed=0)
    model = nn.GPT(cfg).to(device)
    rng = np.random.default_rng(0)
    idx = gp.to_device(rng.integers(0, cfg.vocab_size, (B, T)), device)
    targets = gp.to_device(rng.integers(0, cfg.vocab_size, (B, T)), device)
    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    step = gpt_step_fn(model, opt, idx, targets)
    seconds = timeit(step, device, repeat, warmup=2)
    n = model.num_parameters()
    tokens = B * T
    flops = 6 * n * tokens + 12 * cfg.n_layer * cfg.n_embd * T * tokens  # PaLM appendix B
    print(f"\nGPT '{shape}' training step on {device}, {gp.dtypes.short_name(dt)}: "
          f"{n / 1e6:.2f}M params, batch {B}x{T}")
    print(f"  {seconds * 1e3:.1f} ms/step, {tokens / seconds:,.0f} tokens/s, "
          f"{flops / seconds / 1e12:.2f} TFLOP/s (model flops)")
    if device == "cpu" and dt == np.float32:
        bench_torch(model, cfg, idx, targets, repeat)


def bench_torch(model: nn.GPT, cfg: nn.GPTConfig, idx, targets, repeat: int) -> None:
    """The same model and step in PyTorch eager on the CPU (weights copied from ours)."""
    try:
        import torch
    except ImportError:
        print("  (torch not installed: no PyTorch comparison)")
        return
    tnn = torch.nn
    C = cfg.n_embd

    class TorchBlock(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = tnn.LayerNorm(C), tnn.LayerNorm(C)
            self.qkv, self.proj = tnn.Linear(C, 3 * C), tnn.Linear(C, C)
            self.fc, self.mproj = tnn.Linear(C, 4 * C), tnn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, cfg.n_head, -1).transpose(1, 2) for t in (q, k, v))
            y = tnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mproj(tnn.functional.gelu(self.fc(self.ln_2(x))))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Embedding(cfg.vocab_size, C)
            self.wpe = tnn.Embedding(cfg.block_size, C)
            self.blocks = tnn.ModuleList([TorchBlock() for _ in range(cfg.n_layer)])
            self.ln_f = tnn.LayerNorm(C)

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.T
            return tnn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                targets.view(-1))

    tm = TorchGPT()
    ours = model.state_dict()
    rename = {"attn.qkv": "qkv", "attn.proj": "proj", "mlp.fc": "fc", "mlp.proj": "mproj"}
    with torch.no_grad():
        for name, value in ours.items():
            tname = name
            for a, b in rename.items():
                tname = tname.replace(a, b)
            tensor = torch.from_numpy(value.copy())
            param = tm.get_parameter(tname)
            is_linear = tensor.ndim == 2 and not name.startswith(("wte.", "wpe."))
            param.copy_(tensor.T if is_linear else tensor)  # ours [in, out], torch [out, in]
    tidx, ttgt = torch.from_numpy(gp.to_host(idx)), torch.from_numpy(gp.to_host(targets))
    topt = torch.optim.AdamW(tm.parameters(), lr=3e-4, weight_decay=0.1)
    ours_loss = model.loss(idx, targets).item()
    model.zero_grad()
    theirs_loss = tm(tidx, ttgt).item()
    print(f"  loss ours {ours_loss:.6f} vs torch {theirs_loss:.6f} (same weights and batch)")

    def step():
        loss = tm(tidx, ttgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        topt.step()
        topt.zero_grad()

    seconds = timeit(step, "cpu", repeat, warmup=2)
    print(f"  PyTorch {torch.__version__} eager CPU: {seconds * 1e3:.1f} ms/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "emulated"], default=None,
                        help="emulated: the emulated device (only meaningful with "
                             "--stub-math: it measures the device-side Python path)")
    parser.add_argument("--gpt", choices=list(GPT_SHAPES), default=None,
                        help="GPT shape (default: gpt2 on cuda, small on cpu)")
    parser.add_argument("--dtype", default="float32", help="float32 | bf16 | float16")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--skip-ops", action="store_true")
    parser.add_argument("--stub-math", action="store_true",
                        help="measure the Python overhead only (plan bodies stubbed out)")
    parser.add_argument("--calls", action="store_true",
                        help="count the Python calls per op and per GPT step")
    args = parser.parse_args()
    device = args.device or ("cuda" if gp.device_available() else "cpu")
    if args.calls:
        bench_calls(device)
        return
    if args.stub_math:
        bench_overhead(device, args.repeat or 2000)
        return
    shape = args.gpt or ("gpt2" if device == "cuda" else "small")
    if not args.skip_ops:
        bench_ops(device, args.repeat or 200)
    bench_gpt(device, shape, args.dtype, args.repeat or 5)


if __name__ == "__main__":
    main()
