"""nn.Llama against transformers' LlamaForCausalLM in float64 (issue 27's Done means), where
torch and transformers are installed (a benchmark venv; the test install has neither, so CI
skips this file):

    /tmp/benchvenv/bin/pip install torch transformers pytest
    PYTHONPATH=. /tmp/benchvenv/bin/python -m pytest -q tests/autograd/nn/test_llama_transformers.py

transformers computes RMSNorm, the RoPE tables and the eager softmax in float32 even in a
float64 model (about 7e-6 from a true float64 Llama). The Hugging Face copy here is made float64
throughout instead (those three computations replaced, inside this test only, by the same
formulas in float64); our float64 path is never given their float32 casts. Random configs, no
download: MHA, GQA and MQA, tied and untied embeddings, each loaded from the folder
transformers' save_pretrained writes; logits and loss, then after three AdamW steps on both
sides, equal to 1e-10; our save_pretrained folder loads in transformers with equal logits;
greedy generation with the KV cache gives transformers' greedy generate token for token.
"""

from __future__ import annotations

import numpy as np
import pytest

from autograd import nn, optim

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.llama.modeling_llama")

VOCAB, T = 37, 12


@pytest.fixture
def float64_transformers(monkeypatch):
    """transformers' Llama computing in the model's dtype (float64 here) everywhere."""

    def rms_forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        dim = self.inv_freq.shape[0] * 2
        base = self.config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = modeling.repeat_kv(key, module.num_key_value_groups)
        v = modeling.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.nn.functional.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    monkeypatch.setattr(modeling.LlamaRMSNorm, "forward", rms_forward)
    monkeypatch.setattr(modeling.LlamaRotaryEmbedding, "forward", rope_forward)
    monkeypatch.setattr(modeling, "eager_attention_forward", eager)


def _hf(tmp_path, heads: int, kv: int, tie: bool):
    torch.manual_seed(heads * 10 + kv + tie)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=T,
        rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=tie,
        attn_implementation="eager")
    theirs = transformers.LlamaForCausalLM(cfg).double().eval()
    theirs.save_pretrained(tmp_path / "hf", safe_serialization=True)
    return theirs


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (2, T)), rng.integers(0, VOCAB, (2, T))


def _their_logits(model, idx):
    with torch.no_grad():
        return model(torch.from_numpy(idx)).logits.numpy()


def _our_logits(model, idx):
    return model(idx).numpy()


LAYOUTS = [(4, 4, False), (4, 2, False), (4, 1, True), (4, 2, True)]


@pytest.mark.parametrize("heads,kv,tie", LAYOUTS, ids=["mha", "gqa", "mqa-tied", "gqa-tied"])
def test_logits_loss_and_three_adamw_steps_equal_transformers(tmp_path, float64_transformers,
                                                             heads, kv, tie):
    theirs = _hf(tmp_path, heads, kv, tie)
    ours = nn.Llama.from_pretrained(tmp_path / "hf", dtype=np.float64)
    idx, tgt = _batch()
    np.testing.assert_allclose(_our_logits(ours, idx), _their_logits(theirs, idx), rtol=0,
                               atol=1e-10)
    ours.train()
    theirs.train()
    opt_t = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1)
    opt_o = optim.AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(3):
        idx, tgt = _batch(step + 1)
        loss_t = theirs(torch.from_numpy(idx), labels=None).logits
        loss_t = torch.nn.functional.cross_entropy(loss_t.reshape(-1, VOCAB),
                                                   torch.from_numpy(tgt).reshape(-1))
        opt_t.zero_grad()
        loss_t.backward()
        opt_t.step()
        loss_o = ours.loss(idx, tgt)
        opt_o.zero_grad()
        loss_o.backward()
        opt_o.step()
        assert abs(float(loss_o.item()) - float(loss_t.item())) < 1e-10, step
    theirs.eval()
    ours.eval()
    idx, _ = _batch(9)
    np.testing.assert_allclose(_our_logits(ours, idx), _their_logits(theirs, idx), rtol=0,
                               atol=1e-10)


@pytest.mark.parametrize("heads,kv,tie", LAYOUTS[1:3], ids=["gqa", "mqa-tied"])
def test_our_folder_loads_in_transformers_and_greedy_generation_agrees(
        tmp_path, float64_transformers, heads, kv, tie):
    theirs = _hf(tmp_path, heads, kv, tie)
    ours = nn.Llama.from_pretrained(tmp_path / "hf", dtype=np.float64)
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "ours", torch_dtype=torch.float64, attn_implementation="eager").eval()
    idx, _ = _batch(4)
    np.testing.assert_allclose(_their_logits(again, idx), _their_logits(theirs, idx), rtol=0,
                               atol=1e-12)
    prompt = idx[:1, :4]
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(prompt), max_new_tokens=T - 4, do_sample=False,
                               pad_token_id=0).numpy()
    got = ours.generate(prompt, max_new_tokens=T - 4, temperature=0.0)
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_array_equal(got, want)
