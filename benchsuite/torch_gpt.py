"""PyTorch twin of our GPT for the benchmarks: same module names (state_dict keys match ours
one for one), and our initial weights copied in (Linear weights transposed: ours are
``[in, out]``, PyTorch's ``[out, in]``); and its training step as bench_train times it,
eager or under ``torch.compile``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import nn


def build_torch_gpt(torch: Any, cfg: nn.GPTConfig) -> Any:
    """A PyTorch GPT with our module names, so state_dict keys match ours one for one."""
    tnn, F = torch.nn, torch.nn.functional
    C, H = cfg.n_embd, cfg.n_head

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = tnn.Linear(C, 3 * C), tnn.Linear(C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2)
                       for t in self.qkv(x).split(C, dim=-1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

    class Mlp(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = tnn.Linear(C, 4 * C), tnn.Linear(4 * C, C)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x)))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = tnn.LayerNorm(C), Attention()
            self.ln_2, self.mlp = tnn.LayerNorm(C), Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Embedding(cfg.vocab_size, C)
            self.wpe = tnn.Embedding(cfg.block_size, C)
            self.blocks = tnn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = tnn.LayerNorm(C)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # tied head, as ours
            return F.cross_entropy(logits.view(-1, cfg.vocab_size).float(),
                                   targets.view(-1))

    return Gpt()


def load_our_weights(torch: Any, tmodel: Any, state: dict[str, np.ndarray]) -> None:
    """Copy our (host) state_dict into the PyTorch model; bf16 values are widened to f32."""
    tparams = dict(tmodel.named_parameters())
    if set(tparams) != set(state):
        raise RuntimeError(f"bench_train: parameter names differ: ours only "
                           f"{sorted(set(state) - set(tparams))}, torch only "
                           f"{sorted(set(tparams) - set(state))}")
    with torch.no_grad():
        for name, value in state.items():
            t = torch.from_numpy(np.asarray(value, dtype=np.float32))
            is_linear = t.ndim == 2 and not name.startswith(("wte.", "wpe."))
            tparams[name].copy_(t.T if is_linear else t)  # ours [in, out], torch [out, in]


# -- the benchmark's PyTorch sides ----------------------------------------------------------

def import_torch(no_torch: bool, device: str, threads: int | None, info: dict[str, Any]) -> Any:
    """torch for the comparison (its version and threads recorded in `info`), or None:
    `no_torch`, not installed, no CUDA in this build for a cuda run, or the emulated device
    (its timings are the emulator's, nothing to compare with)."""
    if no_torch:
        return None
    if device == "emulated":
        print("# emulated device: no PyTorch comparison (the emulator's timings)")
        return None
    try:
        import torch
    except ImportError:
        print("# torch is not installed: no PyTorch comparison")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print("# this torch build has no CUDA: no PyTorch comparison")
        return None
    if threads is not None:
        torch.set_num_threads(threads)
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    return torch


def torch_train_step(torch: Any, cfg: nn.GPTConfig, state: dict[str, np.ndarray],
                     idx: np.ndarray, targets: np.ndarray, device: str, dtype: str,
                     hyper: dict[str, Any], compile: bool = False
                     ) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(step, sync) of the PyTorch twin's training step from our initial weights `state`:
    forward (under bf16 autocast for dtype "bf16"), backward, clip_grad_norm_, AdamW,
    zero_grad. With `compile` the model is ``torch.compile``d (default mode; the optimizer
    stays eager, as in nanoGPT): its first call compiles, so it belongs in the warm-up.
    `hyper`: lr, betas, weight_decay, max_norm."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the default; ours never uses TF32
    torch.backends.cudnn.allow_tf32 = False
    tmodel = build_torch_gpt(torch, cfg)
    load_our_weights(torch, tmodel, state)
    tmodel.to(device)
    params = list(tmodel.parameters())
    opt = torch.optim.AdamW(params, lr=hyper["lr"], betas=hyper["betas"],
                            weight_decay=hyper["weight_decay"])
    forward = torch.compile(tmodel) if compile else tmodel
    x = torch.from_numpy(idx).to(device)
    y = torch.from_numpy(targets).to(device)
    use_autocast = dtype == "bf16"

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=use_autocast):
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, hyper["max_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    return step, sync


def torch_memory(torch: Any, device: str, reset: bool = False) -> dict[str, int]:
    """PyTorch's peak allocated and reserved bytes on a GPU since the last reset (`reset`
    starts a new window and returns {}); {} on the host."""
    if device != "cuda":
        return {}
    if reset:
        torch.cuda.reset_peak_memory_stats()
        return {}
    return {"max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved()}
