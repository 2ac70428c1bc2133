"""KV-cache generation (autograd.nn.generation) for nn.GPT and nn.Llama: greedy tokens
identical to re-running the whole window each step (a loop written here on the models'
plain forward), the cached logits equal to the re-run's at every step (MHA, GQA, MQA; past
block_size too, where the window slides), a prompt fed through the cache in chunks, and
top-p sampling: tokens outside the nucleus are never drawn, those inside at their
renormalised rates."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn
from autograd.nn.generation import KVCache, nucleus_mask, sample

BLOCK = 10


def _gpt(dtype=np.float64, seed=6):
    return nn.GPT(nn.GPTConfig(vocab_size=31, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16,
                               dtype=dtype, seed=seed))


def _llama(n_kv_head=2, dtype=np.float64, seed=6):
    model = nn.Llama(nn.LlamaConfig(vocab_size=31, block_size=BLOCK, n_layer=2, n_head=4,
                                    n_embd=32, n_kv_head=n_kv_head, ffn_hidden=40,
                                    rope_theta=100.0, dtype=dtype, seed=seed))
    # N(0, 0.02) weights give near-uniform logits; larger ones make the greedy choices
    # depend on the whole context (so a wrong position or cache entry changes them).
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if not name.endswith("norm.weight"):
            p.data[...] = gp.to_device(rng.normal(0, 0.3, p.shape).astype(p.dtype), p.device)
    return model


MODELS = [pytest.param(_gpt, id="gpt"),
          pytest.param(lambda **kw: _llama(4, **kw), id="llama-mha"),
          pytest.param(lambda **kw: _llama(2, **kw), id="llama-gqa"),
          pytest.param(lambda **kw: _llama(1, **kw), id="llama-mqa")]


def _prompt(device, T=3, seed=0):
    idx = np.random.default_rng(seed).integers(0, 31, (2, T)).astype(np.int32)
    return gp.to_device(idx, gp.backend.resolve_device(device))


def _rerun_greedy(model, prompt, n):
    """Greedy decoding by re-running the model on the last block_size tokens each step:
    the tokens and each step's float64 logits [B, V]."""
    seq, steps = gp.to_host(prompt).astype(np.int64), []
    device = gp.device_of(prompt)
    with ag.no_grad():
        for _ in range(n):
            window = gp.to_device(np.ascontiguousarray(seq[:, -BLOCK:]), device)
            logits = gp.to_host(model(window).data[:, -1]).astype(np.float64)
            steps.append(logits)
            seq = np.concatenate([seq, logits.argmax(-1)[:, None]], axis=1)
    return seq, steps


@pytest.mark.parametrize("make", MODELS)
def test_greedy_with_the_cache_equals_rerunning_the_window(device, make):
    """13 new tokens after 3: the cache serves steps up to block_size 10, then the window
    slides (the re-run crops to the last 10 tokens) and the cache is rebuilt each step."""
    model = make().to(device=device).eval()
    prompt = _prompt(device)
    want, _ = _rerun_greedy(model, prompt, 13)
    model.train()
    got = model.generate(prompt, 13, temperature=0.0)
    assert model.training  # the mode is restored
    assert gp.device_of(got) == gp.device_of(prompt) and got.dtype == np.int32
    np.testing.assert_array_equal(gp.to_host(got), want)
    assert len({tuple(r) for r in want[:, 3:]}) > 1 or len(set(want[0, 3:])) > 1  # not trivial
    uncached = model.generate(prompt, 13, temperature=0.0, use_cache=False)
    np.testing.assert_array_equal(gp.to_host(uncached), want)


@pytest.mark.parametrize("make", MODELS)
def test_cached_logits_equal_the_rerun_logits_at_every_step(device, make):
    model = make().to(device=device).eval()
    prompt = _prompt(device, T=4, seed=1)
    seq, steps = _rerun_greedy(model, prompt, BLOCK - 4)
    cache = KVCache(model.config.n_layer)
    fed = gp.to_host(prompt)
    dev = gp.device_of(prompt)
    with ag.no_grad():
        for i, want in enumerate(steps):
            logits = model.forward_cached(gp.to_device(np.ascontiguousarray(fed), dev), cache)
            assert logits.shape == (2, 31)
            np.testing.assert_allclose(gp.to_host(logits.data), want, rtol=1e-10, atol=1e-10,
                                       err_msg=f"step {i}")
            assert cache.length == 4 + i
            fed = seq[:, 4 + i:5 + i].astype(np.int32)
        assert cache.length == BLOCK - 1
        with pytest.raises(ValueError, match=r"forward_cached: positions 9\.\.10 exceed "
                                             r"block_size 10"):
            model.forward_cached(gp.to_device(np.zeros((2, 2), np.int32), dev), cache)


@pytest.mark.parametrize("make", MODELS)
def test_a_prompt_fed_in_chunks_gives_the_full_forward(make):
    """Queries after cached keys see every earlier key and none after them (causal masks
    aligned to the last key) for chunks of several tokens too."""
    model = make().eval()
    idx = _prompt("cpu", T=9, seed=2)
    with ag.no_grad():
        full = model(idx).data
        cache = KVCache(model.config.n_layer)
        for lo, hi in ((0, 3), (3, 4), (4, 9)):
            got = model.forward_cached(np.ascontiguousarray(idx[:, lo:hi]), cache).data
            np.testing.assert_allclose(got, full[:, hi - 1], rtol=1e-10, atol=1e-10)
    assert [kv.k.shape for kv in cache.layers] == [(2, getattr(model.config, "kv_heads", 2),
                                                     9, model.config.n_embd //
                                                     model.config.n_head)] * 2


def test_float32_cache_tokens_and_logits_agree_with_the_rerun(device):
    model = _llama(2, dtype=np.float32).to(device=device).eval()
    prompt = _prompt(device, seed=3)
    want, steps = _rerun_greedy(model, prompt, 7)
    np.testing.assert_array_equal(gp.to_host(model.generate(prompt, 7, temperature=0.0)),
                                  want)
    cache = KVCache(2)
    with ag.no_grad():
        first = model.forward_cached(prompt, cache)
    np.testing.assert_allclose(gp.to_host(first.data), steps[0], rtol=1e-4, atol=1e-5)


def _nucleus(p, top_p):
    """The nucleus of one row, written plainly: most probable first, until the mass so far
    reaches top_p."""
    chosen, mass = set(), 0.0
    for token in sorted(range(len(p)), key=lambda t: (-p[t], t)):
        if mass >= top_p * p.sum():
            break
        chosen.add(token)
        mass += p[token]
    return chosen


def test_nucleus_mask_is_the_smallest_most_probable_set():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(12, 0.4), size=50)
    probs[0] = [0.5, 0.3, 0.1, 0.06, 0.04, 0, 0, 0, 0, 0, 0, 0]
    for top_p in (0.05, 0.3, 0.8, 0.81, 0.95, 1.0):
        mask = nucleus_mask(probs, top_p)
        for row, keep in zip(probs, mask, strict=True):
            assert set(np.flatnonzero(keep)) == _nucleus(row, top_p), (top_p, row)
    assert set(np.flatnonzero(nucleus_mask(probs[:1], 0.8)[0])) == {0, 1}


def test_top_p_never_draws_outside_the_nucleus_and_keeps_its_proportions():
    probs = np.array([0.5, 0.3, 0.1, 0.06, 0.04])
    logits = np.tile(np.log(probs), (20000, 1))
    for top_p, nucleus in ((0.79, [0, 1]), (0.81, [0, 1, 2]), (0.4, [0])):
        drawn = sample(logits, 1.0, None, top_p, np.random.default_rng(7))[:, 0]
        assert set(np.unique(drawn)) == set(nucleus), top_p
        expected = probs[nucleus] / probs[nucleus].sum()
        freq = np.bincount(drawn, minlength=5)[nucleus] / len(drawn)
        sigma = np.sqrt(expected * (1 - expected) / len(drawn))
        assert np.all(np.abs(freq - expected) <= 4 * sigma + 1e-12), (top_p, freq, expected)
    # without top_p every token is drawn
    drawn = sample(logits, 1.0, None, None, np.random.default_rng(7))[:, 0]
    assert set(np.unique(drawn)) == {0, 1, 2, 3, 4}
    # top_k then top_p: the nucleus of the renormalised top 3 (0.5/0.9, 0.3/0.9, 0.1/0.9)
    drawn = sample(logits, 1.0, 3, 0.9, np.random.default_rng(7))[:, 0]
    assert set(np.unique(drawn)) == {0, 1, 2}


@pytest.mark.parametrize("make", MODELS[:2])
def test_generate_with_top_p_draws_only_nucleus_tokens_and_is_seeded(make):
    model = make().eval()
    prompt = _prompt("cpu", T=2, seed=4)
    out = model.generate(prompt, 8, temperature=1.3, top_p=0.5, seed=11)
    assert np.array_equal(out, model.generate(prompt, 8, temperature=1.3, top_p=0.5, seed=11))
    assert np.array_equal(out, model.generate(prompt, 8, temperature=1.3, top_p=0.5, seed=11,
                                              use_cache=False))
    with ag.no_grad():
        for t in range(2, out.shape[1]):
            logits = model(np.ascontiguousarray(out[:, :t])).data[:, -1].astype(np.float64)
            z = logits / 1.3
            p = np.exp(z - z.max(-1, keepdims=True))
            for row in range(2):
                assert out[row, t] in _nucleus(p[row] / p[row].sum(), 0.5), (row, t)
    draws = {tuple(model.generate(prompt, 8, temperature=1.3, top_p=0.9, seed=s).ravel())
             for s in range(4)}
    assert len(draws) > 1


@pytest.mark.parametrize("kw,words", [
    (dict(temperature=-1.0), "generate: temperature must be >= 0 (0 is greedy), given -1.0"),
    (dict(top_k=0), "generate: top_k must be >= 1 or None, given 0"),
    (dict(top_p=0.0), "generate: top_p must lie in (0, 1] or be None, given 0.0"),
    (dict(top_p=1.5), "generate: top_p must lie in (0, 1] or be None, given 1.5"),
    (dict(max_new_tokens=-1), "generate: max_new_tokens must be >= 0, given -1"),
    (dict(idx=np.zeros(3, np.int64)), "generate: idx must be [B, T] token ids with T >= 1, "
                                      "given shape (3,)"),
])
def test_argument_errors_name_the_argument(kw, words):
    args = dict(idx=np.zeros((1, 2), np.int64), max_new_tokens=2) | kw
    for model in (_gpt(), _llama()):
        with pytest.raises(ValueError) as err:
            model.generate(**args)
        assert words in str(err.value), str(err.value)


def test_a_prompt_longer_than_the_window_is_cropped_as_before():
    """nn.GPT.generate's documented behaviour (and nn.Llama's): only the last block_size
    tokens condition the next one."""
    for model in (_gpt(), _llama()):
        long = _prompt("cpu", T=14, seed=5)
        out = model.generate(long, 4, temperature=0.0)
        np.testing.assert_array_equal(out[:, :14], long)
        cropped = model.generate(np.ascontiguousarray(long[:, -BLOCK:]), 4, temperature=0.0)
        np.testing.assert_array_equal(out[:, 14:], cropped[:, BLOCK:])
