"""PyTorch twin of our GPT for the benchmarks: same module names (state_dict keys match ours
one for one), and our initial weights copied in (Linear weights transposed: ours are
``[in, out]``, PyTorch's ``[out, in]``)."""

from __future__ import annotations

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
