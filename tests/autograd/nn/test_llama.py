"""nn.Llama against a float64 NumPy Llama forward written here from the math (transformers'
LlamaForCausalLM conventions: RMSNorm, rotate-half RoPE, K/V heads repeated per group, causal
softmax attention, SwiGLU MLP, tied or untied head): logits and loss to 1e-10 for MHA, GQA
and MQA, gradients against central differences of that reference, the config's rules, and
a few bf16 AdamW steps."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn, optim
from gpuplan.dtypes import bfloat16

# -- the reference -------------------------------------------------------------------------


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def _rotary(x, theta):
    """x [B, H, T, D]: x * cos + rotate_half(x) * sin, positions 0..T-1."""
    d, t = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    emb = np.concatenate([np.outer(np.arange(t), inv_freq)] * 2, axis=-1)  # [T, D]
    rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def _heads(x, n):
    b, t, _ = x.shape
    return x.reshape(b, t, n, -1).transpose(0, 2, 1, 3)


def reference_logits(p, cfg, idx):
    """float64 logits [B, T, V] from the parameter dict `p` (our names, [in, out] layout)."""
    H, Hkv, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    x = p["embed_tokens.weight"][idx]
    B, T, C = x.shape
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.n_layer):
        L = f"layers.{i}."
        h = _rms(x, p[L + "input_layernorm.weight"], cfg.norm_eps)
        q = _rotary(_heads(h @ p[L + "self_attn.q_proj.weight"], H), cfg.rope_theta)
        k = _rotary(_heads(h @ p[L + "self_attn.k_proj.weight"], Hkv), cfg.rope_theta)
        v = _heads(h @ p[L + "self_attn.v_proj.weight"], Hkv)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D) + causal
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D)
        x = x + y @ p[L + "self_attn.o_proj.weight"]
        h = _rms(x, p[L + "post_attention_layernorm.weight"], cfg.norm_eps)
        g, u = h @ p[L + "mlp.gate_proj.weight"], h @ p[L + "mlp.up_proj.weight"]
        x = x + (g / (1.0 + np.exp(-g)) * u) @ p[L + "mlp.down_proj.weight"]
    x = _rms(x, p["norm.weight"], cfg.norm_eps)
    head = p["embed_tokens.weight"].T if cfg.tie_weights else p["lm_head.weight"]
    return x @ head


def reference_loss(p, cfg, idx, targets):
    logits = reference_logits(p, cfg, idx).reshape(-1, cfg.vocab_size)
    m = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=-1)) + m[:, 0]
    return float((lse - logits[np.arange(len(lse)), targets.reshape(-1)]).mean())


# -- tests -------------------------------------------------------------------------------------

ATTENTION = [pytest.param(4, id="mha"), pytest.param(2, id="gqa"), pytest.param(1, id="mqa")]


def _config(n_kv_head, tie, **kw):
    return nn.LlamaConfig(vocab_size=23, block_size=16, n_layer=2, n_head=4, n_embd=32,
                          n_kv_head=n_kv_head, ffn_hidden=40, rope_theta=500.0, norm_eps=1e-6,
                          tie_weights=tie, dtype=np.float64, seed=3, **kw)


def _params(model):
    return {name: p.numpy().astype(np.float64) for name, p in model.named_parameters()}


def _batch(cfg, T=7, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (2, T)), rng.integers(0, cfg.vocab_size, (2, T)))


@pytest.mark.parametrize("n_kv_head", ATTENTION)
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_forward_and_loss_match_the_reference(device, n_kv_head, tie):
    cfg = _config(n_kv_head, tie)
    model = nn.Llama(cfg).to(device=device)
    idx, targets = _batch(cfg)
    logits, loss = model(ag.tensor(idx, device=device), ag.tensor(targets, device=device))
    p = _params(model)
    np.testing.assert_allclose(logits.numpy(), reference_logits(p, cfg, idx), rtol=1e-10,
                               atol=1e-10)
    assert abs(float(loss.numpy()) - reference_loss(p, cfg, idx, targets)) < 1e-10
    assert float(model.loss(idx, targets).numpy()) == float(loss.numpy())


@pytest.mark.parametrize("n_kv_head", ATTENTION)
def test_gradients_match_central_differences(device, n_kv_head):
    """d loss / d theta for entries of every kind of parameter (shared K/V heads included)
    against central differences of the float64 reference loss."""
    cfg = _config(n_kv_head, tie=n_kv_head == 2)
    model = nn.Llama(cfg).to(device=device)
    idx, targets = _batch(cfg, T=5, seed=1)
    model.loss(ag.tensor(idx, device=device), ag.tensor(targets, device=device)).backward()
    p = _params(model)
    grads = {name: q.grad.numpy() for name, q in model.named_parameters()}
    rng = np.random.default_rng(2)
    for name in p:
        for _ in range(2):
            at = tuple(int(rng.integers(s)) for s in p[name].shape)
            h, old = 1e-5, p[name][at]
            p[name][at] = old + h
            up = reference_loss(p, cfg, idx, targets)
            p[name][at] = old - h
            down = reference_loss(p, cfg, idx, targets)
            p[name][at] = old
            np.testing.assert_allclose(grads[name][at], (up - down) / (2 * h), rtol=1e-5,
                                       atol=1e-9, err_msg=f"{name}{at}")


def test_parameter_names_and_shapes():
    cfg = nn.LlamaConfig(vocab_size=50, block_size=8, n_layer=1, n_head=8, n_embd=64,
                         n_kv_head=2)
    shapes = {n: p.shape for n, p in nn.Llama(cfg).named_parameters()}
    assert shapes == {
        "embed_tokens.weight": (50, 64), "layers.0.input_layernorm.weight": (64,),
        "layers.0.self_attn.q_proj.weight": (64, 64),
        "layers.0.self_attn.k_proj.weight": (64, 16),
        "layers.0.self_attn.v_proj.weight": (64, 16),
        "layers.0.self_attn.o_proj.weight": (64, 64),
        "layers.0.post_attention_layernorm.weight": (64,),
        "layers.0.mlp.gate_proj.weight": (64, 256), "layers.0.mlp.up_proj.weight": (64, 256),
        "layers.0.mlp.down_proj.weight": (256, 64), "norm.weight": (64,),
        "lm_head.weight": (64, 50)}
    assert nn.LlamaConfig(1, 1, 1, 32, 4096).hidden == 11008
    assert nn.LlamaConfig(1, 1, 1, 32, 2048).hidden == 5632


def test_same_seed_same_model_and_init():
    cfg = _config(2, False)
    a, b = _params(nn.Llama(cfg)), _params(nn.Llama(cfg))
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert np.all(a["norm.weight"] == 1.0)
    assert abs(a["layers.0.mlp.up_proj.weight"].std() - 0.02) < 0.005


@pytest.mark.parametrize("kw,words", [
    (dict(n_kv_head=3), "n_kv_head must divide n_head (4), given 3"),
    (dict(n_embd=36), "n_embd (36) must be n_head (4) times an even head dim"),
    (dict(n_embd=20), "n_embd (20) must be n_head (4) times an even head dim"),
    (dict(rope_theta=0.0), "rope_theta must be a finite number > 0"),
    (dict(dropout=1.0), "dropout must lie in [0, 1)"),
    (dict(ffn_hidden=0), "ffn_hidden must be > 0 or None"),
])
def test_config_errors(kw, words):
    base = dict(vocab_size=10, block_size=8, n_layer=1, n_head=4, n_embd=32) | kw
    with pytest.raises(ValueError) as err:
        nn.LlamaConfig(**base)
    assert words in str(err.value), str(err.value)


def test_input_errors():
    model = nn.Llama(_config(2, False))
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
        model(np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match=r"idx must be \[B, T\] token ids"):
        model(np.zeros(5, np.int64))


def test_bf16_adamw_steps_lower_the_loss():
    cfg = nn.LlamaConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, n_embd=16,
                         n_kv_head=1, dtype=bfloat16)
    model = nn.Llama(cfg)
    idx, targets = _batch(cfg, T=8, seed=4)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(5):
        loss = model.loss(idx, targets)
        losses.append(float(loss.numpy()))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0] - 0.1, losses
