"""GPT: parameter layout and init, float64 forward/backward against an independent NumPy
implementation, overfitting a fixed batch, mixed precision and generation."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn, optim
from gpuplan.dtypes import bfloat16
from gpuplan.ops.normalization.reference import layer_norm_reference

SMALL = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
_erf = np.vectorize(math.erf)


def host(a):
    return gp.to_host(a.data if isinstance(a, ag.Tensor) else a).astype(np.float64)


def batch(cfg, B, T, seed=0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64)
    return idx, rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64)


# -- independent float64 NumPy model ----------------------------------------------------------

def np_layer_norm(x, w, b, eps=1e-5):
    return layer_norm_reference(x, w, b, eps)[0]


def np_gpt(P, cfg, idx, targets=None):
    """logits [B, T, V] (and mean cross-entropy) from a dict of float64 parameters."""
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    Dh = C // H
    g = P.get
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    masked = np.triu(np.ones((T, T), bool), k=1)
    for i in range(cfg.n_layer):
        pre = f"blocks.{i}."
        h = np_layer_norm(x, P[pre + "ln_1.weight"], g(pre + "ln_1.bias"))
        qkv = h @ P[pre + "attn.qkv.weight"] + g(pre + "attn.qkv.bias", 0.0)
        heads = [qkv[..., j * C:(j + 1) * C].reshape(B, T, H, Dh).transpose(0, 2, 1, 3)
                 for j in range(3)]
        q, k, v = heads
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(Dh)
        s = np.where(masked, -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ P[pre + "attn.proj.weight"] + g(pre + "attn.proj.bias", 0.0)
        h = np_layer_norm(x, P[pre + "ln_2.weight"], g(pre + "ln_2.bias"))
        u = h @ P[pre + "mlp.fc.weight"] + g(pre + "mlp.fc.bias", 0.0)
        u = 0.5 * u * (1 + _erf(u / math.sqrt(2)))
        x = x + u @ P[pre + "mlp.proj.weight"] + g(pre + "mlp.proj.bias", 0.0)
    x = np_layer_norm(x, P["ln_f.weight"], g("ln_f.bias"))
    logits = x @ (P["wte.weight"].T if cfg.tie_weights else P["head.weight"])
    if targets is None:
        return logits
    flat = logits.reshape(B * T, -1)
    m = flat.max(-1)
    lse = m + np.log(np.exp(flat - m[:, None]).sum(-1))
    return logits, float((lse - flat[np.arange(B * T), targets.reshape(-1)]).mean())


def np_params(model):
    return {k: v.astype(np.float64) for k, v in model.state_dict().items()}


# -- layout and init --------------------------------------------------------------------------

def test_parameter_names_and_shapes():
    cfg = nn.GPTConfig(**SMALL)
    shapes = {n: p.shape for n, p in nn.GPT(cfg).named_parameters()}
    C, V = 8, 13
    assert shapes["wte.weight"] == (V, C) and shapes["wpe.weight"] == (8, C)
    assert shapes["blocks.1.attn.qkv.weight"] == (C, 3 * C)
    assert shapes["blocks.1.attn.qkv.bias"] == (3 * C,)
    assert shapes["blocks.0.attn.proj.weight"] == (C, C)
    assert shapes["blocks.0.mlp.fc.weight"] == (C, 4 * C)
    assert shapes["blocks.0.mlp.proj.weight"] == (4 * C, C)
    assert shapes["ln_f.bias"] == (C,) and "head.weight" not in shapes
    assert len(shapes) == 2 + 2 * 12 + 2
    untied = dict(nn.GPT(nn.GPTConfig(**SMALL, tie_weights=False, bias=False))
                  .named_parameters())
    assert untied["head.weight"].shape == (C, V)
    assert not any(n.endswith("bias") for n in untied)
    with pytest.raises(ValueError, match="divisible"):
        nn.GPTConfig(13, 8, 1, 3, 8)
    with pytest.raises(ValueError, match="n_layer"):
        nn.GPTConfig(13, 8, 0, 2, 8)


@pytest.mark.parametrize("change,message", [
    ({"vocab_size": 10**13}, r"vocab_size must be an integer in \[1, 2147483647\], given 10"),
    ({"n_embd": 2**40, "n_head": 1}, r"n_embd must be an integer in \[1, 2147483647\]"),
    ({"vocab_size": 2**31 - 1, "n_embd": 2**20, "n_head": 1},
     r"give 2.2.e\+15 parameters, more than 1.1e\+12"),  # each extent fits, the model not
    ({"n_head": True}, r"n_head must be an integer .* given True"),
    ({"n_layer": 2.0}, r"n_layer must be an integer .* given 2.0"),
    ({"dropout": "0.1"}, r"dropout must be a number in \[0, 1\], given '0.1'"),
    ({"attn_dropout": 2}, r"attn_dropout must be a number in \[0, 1\], given 2"),
    ({"bias": "yes"}, r"bias must be True or False, given 'yes'"),
    ({"activation": ["gelu"]}, r"activation must be one of \['gelu', 'gelu_tanh'\]"),
    ({"dtype": "int64"}, r"dtype must be a float dtype .* given 'int64'"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*64|seed must be an integer"),
])
def test_config_values_are_checked_and_the_size_bounded(change, message):
    """Before: a 2**40-wide or 10**13-word model passed and died allocating (a NumPy
    MemoryError traceback); a list activation raised TypeError; True was a head count."""
    with pytest.raises(ValueError, match=message) as info:
        nn.GPTConfig(**{**SMALL, **change})
    assert str(info.value).startswith("GPTConfig: ")


@pytest.mark.parametrize("options", [{}, {"bias": False}, {"tie_weights": False}])
def test_num_parameters_counts_what_the_model_holds(options):
    cfg = nn.GPTConfig(**SMALL, **options)
    assert cfg.num_parameters() == sum(p.data.size for p in nn.GPT(cfg).parameters())


def test_init_is_seeded_and_gpt2_scaled():
    cfg = nn.GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=64, seed=7)
    a, b = nn.GPT(cfg).state_dict(), nn.GPT(cfg).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    c = nn.GPT(nn.GPTConfig(**{**cfg.__dict__, "seed": 8})).state_dict()
    assert not np.array_equal(a["wte.weight"], c["wte.weight"])
    assert abs(a["blocks.0.mlp.fc.weight"].std() - 0.02) < 0.002
    assert abs(a["blocks.2.attn.proj.weight"].std() - 0.02 / math.sqrt(8)) < 0.001
    assert abs(a["blocks.3.mlp.proj.weight"].std() - 0.02 / math.sqrt(8)) < 0.001
    assert np.all(a["blocks.1.ln_2.weight"] == 1) and np.all(a["blocks.1.attn.qkv.bias"] == 0)
    assert a["wte.weight"].dtype == np.float32


# -- float64 forward and backward against the NumPy model -------------------------------------

@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_forward_matches_numpy_float64(tie):
    cfg = nn.GPTConfig(**SMALL, tie_weights=tie, dtype=np.float64, seed=3)
    model = nn.GPT(cfg)
    _perturb_norms_and_biases(model)
    idx, targets = batch(cfg, 3, 7)
    logits, loss = model(idx, targets)
    ref_logits, ref_loss = np_gpt(np_params(model), cfg, idx, targets)
    assert logits.shape == (3, 7, 13) and logits.dtype == np.float64
    np.testing.assert_allclose(host(logits), ref_logits, rtol=1e-10, atol=1e-10)
    assert abs(loss.item() - ref_loss) < 1e-10
    np.testing.assert_allclose(host(model(idx)), ref_logits, rtol=1e-10, atol=1e-10)
    assert abs(model.loss(ag.tensor(idx), ag.tensor(targets)).item() - ref_loss) < 1e-10


def _perturb_norms_and_biases(model):
    """Make LayerNorm weights/biases and Linear biases non-trivial (init sets them to 1/0),
    so that their gradients and the bias paths are really exercised."""
    rng = np.random.default_rng(11)
    for name, p in model.named_parameters():
        if name.endswith("bias") or ".ln_" in f".{name}":
            base = 1.0 if name.endswith("weight") else 0.0
            p.data[...] = (base + 0.1 * rng.standard_normal(p.shape)).astype(p.dtype)


CHECKED = ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.ln_1.bias",
           "blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.bias", "blocks.1.attn.proj.weight",
           "blocks.0.mlp.fc.weight", "blocks.1.mlp.proj.bias", "ln_f.weight", "ln_f.bias"]


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_gradients_match_finite_differences(tie):
    cfg = nn.GPTConfig(**SMALL, tie_weights=tie, dtype=np.float64, seed=5)
    model = nn.GPT(cfg)
    _perturb_norms_and_biases(model)
    idx, targets = batch(cfg, 2, 6, seed=1)
    model.loss(idx, targets).backward()
    P = np_params(model)
    grads = {n: host(p.grad) for n, p in model.named_parameters()}
    assert set(grads) == set(P)
    names = CHECKED + ([] if tie else ["head.weight"])
    rng = np.random.default_rng(2)
    eps = 1e-5
    for name in names:
        flat = P[name].reshape(-1)
        picks = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        if name == "wte.weight":  # make sure rows that were looked up are included
            picks = np.concatenate([picks, idx[0, :2] * cfg.n_embd + 1])
        for i in picks:
            orig = flat[i]
            flat[i] = orig + eps
            up = np_gpt(P, cfg, idx, targets)[1]
            flat[i] = orig - eps
            down = np_gpt(P, cfg, idx, targets)[1]
            flat[i] = orig
            numeric = (up - down) / (2 * eps)
            analytic = grads[name].reshape(-1)[i]
            assert abs(analytic - numeric) <= 1e-8 + 1e-6 * abs(numeric), (
                f"d loss / d {name}[{i}]: analytic {analytic}, numeric {numeric}")
    # Rows of wpe beyond T get no gradient; the tied table collects lookups and the head.
    assert np.all(grads["wpe.weight"][6:] == 0)
    assert np.any(grads["wpe.weight"][:6] != 0)


def test_dropout_only_in_training_mode():
    base = dict(SMALL, dtype=np.float64, seed=2)
    plain = nn.GPT(nn.GPTConfig(**base))
    dropped = nn.GPT(nn.GPTConfig(**base, dropout=0.2))
    idx, _ = batch(plain.config, 2, 8)
    dropped.eval()
    np.testing.assert_array_equal(host(dropped(idx)), host(plain(idx)))
    dropped.train()
    assert not np.allclose(host(dropped(idx)), host(plain(idx)))


def test_attention_dropout_acts_in_training_only():
    """attn_dropout drops attention probabilities (dropout 0 elsewhere) in training only;
    None means dropout's value; out-of-range values are refused."""
    base = dict(SMALL, dtype=np.float64, seed=2)
    plain = nn.GPT(nn.GPTConfig(**base))
    dropped = nn.GPT(nn.GPTConfig(**base, attn_dropout=0.3))
    assert dropped.blocks[0].attn.attn_dropout == 0.3
    assert nn.GPT(nn.GPTConfig(**base, dropout=0.1)).blocks[0].attn.attn_dropout == 0.1
    idx, _ = batch(plain.config, 2, 8)
    dropped.eval()
    np.testing.assert_array_equal(host(dropped(idx)), host(plain(idx)))
    dropped.train()
    assert not np.allclose(host(dropped(idx)), host(plain(idx)))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="attn_dropout"):
            nn.GPTConfig(**base, attn_dropout=bad)


def test_sequence_longer_than_block_size_is_rejected():
    model = nn.GPT(nn.GPTConfig(**SMALL))
    with pytest.raises(ValueError, match="block_size"):
        model(np.zeros((1, 9), np.int64))


# -- the hooks a parallel model runs ----------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False])
def test_forward_is_embed_blocks_logits_and_forward_stage_splits_it(tie):
    cfg = nn.GPTConfig(**SMALL, tie_weights=tie, dtype=np.float64, seed=2)
    model = nn.GPT(cfg)
    idx, _ = batch(cfg, 2, 8)
    want = host(model(idx))
    x = model.embed(idx)
    for block in model.blocks:
        x = block(x)
    np.testing.assert_array_equal(host(model.logits(x)), want)
    np.testing.assert_array_equal(host(model.forward_stage(idx)), want)
    # Two pipeline stages: each holds its own blocks.
    blocks = list(model.blocks)
    model.blocks = nn.ModuleList(blocks[:1])
    x = model.forward_stage(idx, last=False)
    model.blocks = nn.ModuleList(blocks[1:])
    np.testing.assert_array_equal(host(model.forward_stage(x, first=False)), want)


def _head_share(dense, cfg, heads):
    """An attention layer holding `heads` of `dense` only: the [q | k | v] columns of those
    heads in qkv, the matching rows of proj (its bias on the share holding head 0)."""
    C, Dh = cfg.n_embd, cfg.n_embd // cfg.n_head
    cols = np.concatenate([np.arange(part * C + h * Dh, part * C + (h + 1) * Dh)
                           for part in range(3) for h in heads])
    rows = np.concatenate([np.arange(h * Dh, (h + 1) * Dh) for h in heads])
    share = type(dense)(cfg)
    share.qkv = nn.Linear(C, len(cols), dtype=np.float64)
    share.qkv.weight.data[...] = dense.qkv.weight.data[:, cols]
    share.qkv.bias.data[...] = dense.qkv.bias.data[cols]
    share.proj = nn.Linear(len(rows), C, bias=heads[0] == 0, dtype=np.float64)
    share.proj.weight.data[...] = dense.proj.weight.data[rows]
    if share.proj.bias is not None:
        share.proj.bias.data[...] = dense.proj.bias.data
    return share


def test_attention_runs_on_a_subset_of_whole_heads():
    """A qkv/proj pair holding some heads only ([q | k | v] columns of those heads, the
    matching proj rows) gives their share of the output: over a split of the heads (proj
    bias once) the shares sum to the dense output, which is what tensor parallelism uses."""
    cfg = nn.GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=4, n_embd=8,
                       dtype=np.float64, seed=3)
    dense = nn.GPT(cfg).blocks[0].attn
    x = ag.tensor(np.random.default_rng(0).standard_normal((2, 8, cfg.n_embd)))
    total = 0.0
    for heads in ([0], [1, 2, 3]):
        total = total + host(_head_share(dense, cfg, heads)(x))
    np.testing.assert_allclose(total, host(dense(x)), rtol=1e-12, atol=1e-14)


def test_head_subset_with_attention_dropout_draws_the_dense_masks():
    """In training with attention dropout, a layer holding heads [first_head, ...) only
    drops the entries the dense layer drops for those heads (and advances the generator as
    far): the shares still sum to the dense output."""
    cfg = nn.GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=4, n_embd=8,
                       attn_dropout=0.4, dtype=np.float64, seed=3)
    dense = nn.GPT(cfg).blocks[0].attn
    x = ag.tensor(np.random.default_rng(0).standard_normal((2, 8, cfg.n_embd)))
    ag.manual_seed(8)
    want = host(dense(x))
    dense_state = ag.random.default_generator.get_state()
    total = 0.0
    for heads in ([0, 1], [2], [3]):
        share = _head_share(dense, cfg, heads)
        share.first_head = heads[0]
        ag.manual_seed(8)
        total = total + host(share(x))
        assert ag.random.default_generator.get_state() == dense_state
    np.testing.assert_allclose(total, want, rtol=1e-12, atol=1e-14)
    ag.manual_seed(9)
    assert not np.allclose(host(dense(x)), want)  # another seed: other masks


# -- training ---------------------------------------------------------------------------------

def test_tiny_gpt_overfits_a_fixed_batch():
    """60 AdamW steps on one batch of random tokens: ln(16) = 2.77 -> below 0.05."""
    cfg = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32, seed=0)
    model = nn.GPT(cfg)
    idx, targets = batch(cfg, 4, 8, seed=3)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(60):
        loss = model.loss(idx, targets)
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        first = loss.item() if first is None else first
    final = model.loss(idx, targets).item()
    assert first == pytest.approx(math.log(16), abs=0.3)
    assert final < 0.05, f"loss {first:.3f} -> {final:.3f}"  # ~0.002 when written


def test_bf16_model_trains_with_f32_master_weights():
    cfg = nn.GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16,
                       dtype=bfloat16, seed=1)
    model = nn.GPT(cfg)
    assert all(p.dtype == bfloat16 for p in model.parameters())
    idx, targets = batch(cfg, 4, 8, seed=4)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(25):
        loss = model.loss(idx, targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < 1.0 < losses[0]  # 2.76 -> 0.50 when written
    for p in model.parameters():
        master = opt.state[id(p)]["master"]
        assert master.dtype == np.float32
        np.testing.assert_array_equal(gp.to_host(p.data), gp.to_host(master).astype(bfloat16))


@pytest.mark.gpu
def test_gpu_matches_cpu():
    cfg = nn.GPTConfig(**SMALL, seed=4)
    cpu, gpu = nn.GPT(cfg), nn.GPT(cfg).to("cuda")
    idx, targets = batch(cfg, 2, 8)
    lc = cpu.loss(idx, targets)
    lg = gpu.loss(gp.to_device(idx, "cuda"), gp.to_device(targets, "cuda"))
    assert lg.item() == pytest.approx(lc.item(), rel=1e-4)
    lc.backward()
    lg.backward()
    for (n, p), q in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        np.testing.assert_allclose(host(q.grad), host(p.grad), rtol=1e-3, atol=1e-5,
                                   err_msg=n)


# -- generation -------------------------------------------------------------------------------

def test_generate_greedy_matches_numpy_argmax():
    cfg = nn.GPTConfig(**SMALL, dtype=np.float64, seed=6)
    model = nn.GPT(cfg)
    P = np_params(model)
    prompt = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    out = model.generate(prompt, max_new_tokens=8, temperature=0.0)
    assert out.shape == (2, 11) and out.dtype == np.int32 and model.training
    np.testing.assert_array_equal(out[:, :3], prompt)
    seq = prompt.astype(np.int64)
    for _ in range(8):  # the context is cropped to block_size (8) once it grows past it
        logits = np_gpt(P, cfg, seq[:, -cfg.block_size:])
        seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)
    # top_k=1 sampling is greedy whatever the temperature and seed.
    np.testing.assert_array_equal(model.generate(prompt, 8, temperature=1.5, top_k=1, seed=9),
                                  out)


def test_generate_sampling_is_seeded():
    model = nn.GPT(nn.GPTConfig(**SMALL, seed=1))
    prompt = ag.tensor(np.zeros((3, 1), np.int64))
    a = model.generate(prompt, 6, temperature=1.0, top_k=5, seed=42)
    b = model.generate(prompt, 6, temperature=1.0, top_k=5, seed=42)
    assert isinstance(a, ag.Tensor) and a.shape == (3, 7)
    np.testing.assert_array_equal(a.data, b.data)
    assert np.all((a.data >= 0) & (a.data < 13))
    draws = [model.generate(prompt, 6, seed=s).data for s in range(4)]
    assert any(not np.array_equal(draws[0], d) for d in draws[1:])


def test_mlp_fuses_gelu_into_fc_unless_fc_is_substituted(monkeypatch):
    """A dense fc + GELU runs as one F.linear_gelu (the activation in the GEMM epilogue),
    with the composed path's values; an fc without a fused form (`forward_gelu`), or
    ``fused_mlp=False``, runs fc, then act."""
    from autograd.nn import functional as F

    cfg = nn.GPTConfig(**SMALL, dtype=np.float64, seed=4)
    mlp = nn.GPT(cfg).blocks[0].mlp
    x = ag.tensor(np.random.default_rng(0).standard_normal((2, 3, 8)))
    calls = []
    fused = F.linear_gelu
    monkeypatch.setattr(F, "linear_gelu", lambda *a, **k: calls.append(k) or fused(*a, **k))
    out = host(mlp(x))
    assert calls == [{"approximate": "none"}]
    want = host(mlp.proj(F.gelu(mlp.fc(x))))
    np.testing.assert_allclose(out, want, rtol=1e-14, atol=1e-15)

    class Wrapped(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, t):
            return self.inner(t)

    fc = mlp.fc
    mlp.fc = Wrapped(fc)
    np.testing.assert_allclose(host(mlp(x)), want, rtol=1e-14, atol=1e-15)
    assert len(calls) == 1
    unfused = nn.GPT(nn.GPTConfig(**SMALL, dtype=np.float64, seed=4, fused_mlp=False))
    np.testing.assert_allclose(host(unfused.blocks[0].mlp(x)), want, rtol=1e-14, atol=1e-15)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_residual_adds_feeding_a_layer_norm_are_fused(monkeypatch, dtype):
    """Each block's first residual add runs with ln_2, each block's output add with the next
    block's ln_1, the last one with ln_f (F.residual_layer_norm), with the composed values
    and gradients (block by block, each output added alone); a norm that is not an
    nn.LayerNorm runs the add and the norm apart."""
    from autograd.nn import functional as F

    cfg = nn.GPTConfig(**dict(SMALL, n_layer=3), dtype=dtype, seed=6)
    model = nn.GPT(cfg)
    _perturb_norms_and_biases(model)
    idx, targets = batch(cfg, 2, 5)
    x = model.embed(idx)
    for block in model.blocks:
        x = block(x)
    logits = model.logits(x)
    want = host(logits)
    F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1)).backward()
    want_grads = {n: host(p.grad) for n, p in model.named_parameters()}
    model.zero_grad()
    calls = []
    fused = F.residual_layer_norm
    monkeypatch.setattr(F, "residual_layer_norm",
                        lambda *a, **k: calls.append(1) or fused(*a, **k))
    logits, loss = model(idx, targets)
    np.testing.assert_array_equal(host(logits), want)
    assert len(calls) == 2 * cfg.n_layer  # ln_2 of every block, ln_1 of all but the first, ln_f
    loss.backward()
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(host(p.grad), want_grads[n], err_msg=n)
    calls.clear()
    model.blocks[0].ln_2 = nn.RMSNorm(cfg.n_embd, dtype=dtype)
    x = model.embed(idx)
    s = x + model.blocks[0].attn(model.blocks[0].ln_1(x))
    out = s + model.blocks[0].mlp(model.blocks[0].ln_2(s))
    np.testing.assert_array_equal(host(model.blocks[0](x)), host(out))
    assert calls == []
