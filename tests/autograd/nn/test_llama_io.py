"""Llama folders: save/load round trips, Hugging Face folders written here with safetensors
(one file, a sharded index with bf16 and f16 shards) against a float64 NumPy Llama that reads
transformers' names and [out, in] layout directly, every refused config option as one line,
and one-line errors listing missing, unexpected or misshapen tensors. Where transformers and
torch are installed, logits against transformers' LlamaForCausalLM both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import gpuplan as gp
from autograd import nn
from autograd.nn.llama_io import LlamaFormatError
from gpuplan.dtypes import bfloat16

# -- a Hugging Face folder and the model it describes, both written from the HF side -------

HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 29,
             "hidden_size": 32, "intermediate_size": 44, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
             "max_position_embeddings": 24, "rms_norm_eps": 1e-6, "rope_theta": 300.0,
             "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
             "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
             "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.46.0"}


def _hf_weights(hf, seed=0):
    """Random float64 tensors under LlamaForCausalLM's names, [out, in] as torch stores."""
    C, F, V = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    D = C // hf["num_attention_heads"]
    q, kv = hf["num_attention_heads"] * D, hf["num_key_value_heads"] * D
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C))}
    for i in range(hf["num_hidden_layers"]):
        L = f"model.layers.{i}."
        w[L + "input_layernorm.weight"] = 1 + rng.normal(0, 0.2, C)
        w[L + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.2, C)
        for name, shape in (("self_attn.q_proj", (q, C)), ("self_attn.k_proj", (kv, C)),
                            ("self_attn.v_proj", (kv, C)), ("self_attn.o_proj", (C, q)),
                            ("mlp.gate_proj", (F, C)), ("mlp.up_proj", (F, C)),
                            ("mlp.down_proj", (C, F))):
            w[L + name + ".weight"] = rng.normal(0, 0.3, shape)
    w["model.norm.weight"] = 1 + rng.normal(0, 0.2, C)
    if not hf["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(0, 0.5, (V, C))
    return w


def _hf_reference(w, hf, idx):
    """float64 logits of LlamaForCausalLM's math on its own tensors: F.linear is x @ W^T,
    heads are consecutive Dh-wide column blocks of a projection, RoPE rotates dimension i
    with i + Dh/2 (rotate_half) by position * theta^(-2(i mod Dh/2)/Dh)."""
    H, Hkv, eps = hf["num_attention_heads"], hf["num_key_value_heads"], hf["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][idx]
    B, T, C = x.shape
    D = C // H
    angle = np.outer(np.arange(T), hf["rope_theta"] ** (-np.arange(0, D, 2) / D))
    cos, sin = np.cos(np.tile(angle, 2)), np.sin(np.tile(angle, 2))

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    def heads(v, n, rope):
        v = v.reshape(B, T, n, D).transpose(0, 2, 1, 3)
        if not rope:
            return v
        return v * cos + np.concatenate([-v[..., D // 2:], v[..., :D // 2]], -1) * sin

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(hf["num_hidden_layers"]):
        L = f"model.layers.{i}."
        h = norm(x, w[L + "input_layernorm.weight"])
        q = heads(h @ w[L + "self_attn.q_proj.weight"].T, H, True)
        k = np.repeat(heads(h @ w[L + "self_attn.k_proj.weight"].T, Hkv, True), H // Hkv, 1)
        v = np.repeat(heads(h @ w[L + "self_attn.v_proj.weight"].T, Hkv, False), H // Hkv, 1)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(D) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        y = (p / p.sum(-1, keepdims=True)) @ v
        x = x + y.transpose(0, 2, 1, 3).reshape(B, T, C) @ w[L + "self_attn.o_proj.weight"].T
        h = norm(x, w[L + "post_attention_layernorm.weight"])
        g, u = h @ w[L + "mlp.gate_proj.weight"].T, h @ w[L + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[L + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight" if hf["tie_word_embeddings"] else "lm_head.weight"]
    return norm(x, w["model.norm.weight"]) @ head.T


def _write_folder(folder, hf, weights, dtype=np.float32, shards=None):
    """config.json + model.safetensors, or with `shards` (file name -> (dtype, names)) a
    sharded model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    if shards is None:
        safetensors.numpy.save_file({n: a.astype(dtype) for n, a in weights.items()},
                                    str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for file, (shard_dtype, names) in shards.items():
        arrays = {n: np.ascontiguousarray(weights[n].astype(shard_dtype)) for n in names}
        safetensors.numpy.save_file(arrays, str(folder / file), metadata={"format": "pt"})
        index["weight_map"].update({n: file for n in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def _stored(weights, dtype):
    """The float64 values a file of `dtype` holds for `weights`."""
    return {n: a.astype(dtype).astype(np.float64) for n, a in weights.items()}


def _idx(vocab, T=11, B=2, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (B, T), dtype=np.int64)


def _logits(model, idx):
    return gp.to_host(model(idx).data).astype(np.float64)


def _model(tie=False, n_kv_head=2, dtype=np.float64, seed=4):
    return nn.Llama(nn.LlamaConfig(vocab_size=29, block_size=16, n_layer=2, n_head=4,
                                   n_embd=32, n_kv_head=n_kv_head, ffn_hidden=44,
                                   rope_theta=300.0, norm_eps=1e-6, tie_weights=tie,
                                   dtype=dtype, seed=seed))


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_round_trip_is_exact_and_in_eval_mode(tmp_path, tie, n_kv_head):
    model = _model(tie, n_kv_head)
    folder = model.save_pretrained(tmp_path / "m")
    loaded = nn.Llama.from_pretrained(folder, dtype=np.float64, seed=4)
    assert loaded.config == model.config
    assert not loaded.training
    a, b = model.state_dict(), loaded.state_dict()
    assert list(a) == list(b) and all(np.array_equal(a[n], b[n]) for n in a)
    idx = _idx(29)
    assert np.array_equal(_logits(loaded, idx), _logits(model.eval(), idx))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_saved_folder_has_transformers_names_layout_and_config(tmp_path, tie):
    model = _model(tie)
    folder = model.save_pretrained(tmp_path / "m")
    hf = json.loads((folder / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["model_type"] == "llama"
    assert {k: hf[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "head_dim", "max_position_embeddings",
                               "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                               "torch_dtype", "hidden_act")} == {
        "vocab_size": 29, "hidden_size": 32, "intermediate_size": 44, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 300.0,
        "tie_word_embeddings": tie, "torch_dtype": "float64", "hidden_act": "silu"}
    expected = {n: a.shape for n, a in _hf_weights({**HF_CONFIG, "tie_word_embeddings": tie,
                                                    "max_position_embeddings": 16}).items()}
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}  # transformers refuses files without it
        got = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 - safe_open has no iter
    assert {n: a.shape for n, a in got.items()} == expected
    assert {a.dtype for a in got.values()} == {np.dtype(np.float64)}
    idx = _idx(29)
    want = _hf_reference(got, {**hf, "max_position_embeddings": 16}, idx)
    np.testing.assert_allclose(_logits(model, idx), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_hf_folder_in_f32_loads_and_matches_a_numpy_llama(tmp_path, tie, device):
    hf = {**HF_CONFIG, "tie_word_embeddings": tie}
    weights = _hf_weights(hf)
    folder = _write_folder(tmp_path / "hf", hf, weights, np.float32)
    model = nn.Llama.from_pretrained(folder, dtype=np.float64).to(device=device)
    cfg = model.config
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd,
            cfg.kv_heads, cfg.hidden, cfg.rope_theta, cfg.norm_eps, cfg.tie_weights) == \
        (29, 24, 2, 4, 32, 2, 44, 300.0, 1e-6, tie)
    idx = _idx(29, T=13)
    want = _hf_reference(_stored(weights, np.float32), hf, idx)
    got = _logits(model, gp.to_device(idx, gp.backend.resolve_device(device)))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_sharded_bf16_and_f16_folder_loads_and_matches_a_numpy_llama(tmp_path):
    weights = _hf_weights(HF_CONFIG, seed=1)
    names = list(weights)
    half = len(names) // 2
    folder = _write_folder(tmp_path / "hf", HF_CONFIG, weights, shards={
        "model-00001-of-00002.safetensors": (bfloat16, names[:half]),
        "model-00002-of-00002.safetensors": (np.float16, names[half:])})
    stored = {**_stored({n: weights[n] for n in names[:half]}, bfloat16),
              **_stored({n: weights[n] for n in names[half:]}, np.float16)}
    idx = _idx(29, T=9, seed=2)
    model = nn.Llama.from_pretrained(folder, dtype=np.float64)
    np.testing.assert_allclose(_logits(model, idx), _hf_reference(stored, HF_CONFIG, idx),
                               rtol=1e-10, atol=1e-10)
    bf = nn.Llama.from_pretrained(folder, dtype=bfloat16)
    got = bf.embed_tokens.weight.data
    assert got.dtype == bfloat16
    assert np.array_equal(got.view(np.uint16),
                          weights["model.embed_tokens.weight"].astype(bfloat16).view(np.uint16))


def test_buffers_of_old_files_and_a_tied_copy_of_the_embedding_are_accepted(tmp_path):
    hf = {**HF_CONFIG, "tie_word_embeddings": True}
    weights = _hf_weights(hf)
    extra = {**weights, "lm_head.weight": weights["model.embed_tokens.weight"],
             "model.layers.0.self_attn.rotary_emb.inv_freq": np.arange(4.0)}
    folder = _write_folder(tmp_path / "hf", hf, extra)
    idx = _idx(29)
    np.testing.assert_allclose(_logits(nn.Llama.from_pretrained(folder, dtype=np.float64), idx),
                               _hf_reference(_stored(weights, np.float32), hf, idx),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("field,value,words", [
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope_scaling {'rope_type': "
                                                             "'llama3'"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling {'type': 'linear'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}, "rope_parameters"),
    ("attention_bias", True, "attention_bias True is not supported"),
    ("mlp_bias", True, "mlp_bias True is not supported"),
    ("sliding_window", 4096, "sliding_window 4096 is not supported"),
    ("use_sliding_window", True, "use_sliding_window True is not supported"),
    ("layer_types", ["sliding_attention", "full_attention"], "layer_types"),
    ("head_dim", 16, "head_dim 16 is not supported by nn.Llama (expected null or "
                     "hidden_size / num_attention_heads = 8)"),
    ("hidden_act", "gelu", "hidden_act 'gelu' is not supported by nn.Llama (expected 'silu')"),
    ("model_type", "mistral", "model_type 'mistral' is not supported"),
    ("quantization_config", {"quant_method": "gptq"}, "quantization_config"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor 0.5 is not supported by nn.Llama "
                                   "(expected 1: RoPE rotates whole heads)"),
    ("num_key_value_heads", 3, "n_kv_head must divide n_head (4), given 3"),
    ("hidden_size", "32", "hidden_size must be an integer in [1, 2**31), given '32'"),
    ("rms_norm_eps", None, "rms_norm_eps must be a finite number, given None"),
    ("tie_word_embeddings", 1, "tie_word_embeddings must be true or false, given 1"),
])
def test_each_unsupported_option_is_refused_in_one_line_naming_it(tmp_path, field, value,
                                                                   words):
    folder = _write_folder(tmp_path / "hf", {**HF_CONFIG, field: value},
                           _hf_weights(HF_CONFIG))
    with pytest.raises(LlamaFormatError) as err:
        nn.Llama.from_pretrained(folder)
    text = str(err.value)
    assert "\n" not in text and "config.json" in text and words in text, text


def test_supported_spellings_of_the_defaults_load(tmp_path):
    """rope_scaling of type 'default', transformers 5's rope_parameters, head_dim equal to
    hidden / heads, 'swish', any pretraining_tp and absent num_key_value_heads (MHA)."""
    hf = {**HF_CONFIG, "rope_scaling": {"rope_type": "default"}, "head_dim": 8,
          "hidden_act": "swish", "pretraining_tp": 2, "rope_theta": 1.0,
          "rope_parameters": {"rope_type": "default", "rope_theta": 300.0},
          "layer_types": ["full_attention"] * 2}
    del hf["num_key_value_heads"]
    weights = _hf_weights({**hf, "num_key_value_heads": 4})
    model = nn.Llama.from_pretrained(_write_folder(tmp_path / "hf", hf, weights),
                                     dtype=np.float64)
    assert model.config.kv_heads == 4 and model.config.rope_theta == 300.0
    idx = _idx(29)
    want = _hf_reference(_stored(weights, np.float32), {**hf, "num_key_value_heads": 4,
                                                        "rope_theta": 300.0}, idx)
    np.testing.assert_allclose(_logits(model, idx), want, rtol=1e-10, atol=1e-10)


def _refusal(folder):
    with pytest.raises(LlamaFormatError) as err:
        nn.Llama.from_pretrained(folder)
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_missing_unexpected_and_misshapen_tensors_are_listed(tmp_path):
    weights = _hf_weights(HF_CONFIG)
    less = {n: a for n, a in weights.items() if "layers.1.mlp" not in n and n != "lm_head.weight"}
    text = _refusal(_write_folder(tmp_path / "a", HF_CONFIG, {**less, "model.extra": np.ones(3)}))
    assert ("missing [model.layers.1.mlp.gate_proj.weight, model.layers.1.mlp.up_proj.weight, "
            "model.layers.1.mlp.down_proj.weight, lm_head.weight], unexpected [model.extra]"
            in text), text
    wrong = {**weights, "model.layers.0.self_attn.k_proj.weight": np.ones((32, 32)),
             "model.norm.weight": np.ones(31)}
    text = _refusal(_write_folder(tmp_path / "b", HF_CONFIG, wrong))
    assert ("model.layers.0.self_attn.k_proj.weight (32, 32) (expected (16, 32)), "
            "model.norm.weight (31,) (expected (32,))") in text, text
    text = _refusal(_write_folder(tmp_path / "c", HF_CONFIG, weights, np.int32))
    assert "tensors must be float32, float16, bfloat16 or float64, given" in text, text
    tied = {**HF_CONFIG, "tie_word_embeddings": True}
    text = _refusal(_write_folder(tmp_path / "d", tied, weights))
    assert "tie_word_embeddings is true but lm_head.weight differs" in text, text


def test_bad_folders_and_indexes_are_one_line(tmp_path):
    assert "config.json is missing" in _refusal(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    assert "no weights (expected model.safetensors or model.safetensors.index.json)" in \
        _refusal(tmp_path)
    weights = _hf_weights(HF_CONFIG)
    names = list(weights)
    folder = _write_folder(tmp_path / "s", HF_CONFIG, weights, shards={
        "a.safetensors": (np.float32, names[:5]), "b.safetensors": (np.float32, names[5:])})
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for file, words in (("c.safetensors", "shard 'c.safetensors' is not a file in"),
                        ("../a.safetensors", "shard '../a.safetensors' is not a file in"),
                        ("b.safetensors", "b.safetensors: does not hold what "
                                          "model.safetensors.index.json maps to it: missing "
                                          f"[{names[0]}], not in the index []")):
        moved = {**index["weight_map"], names[0]: file}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": moved}))
        text = _refusal(folder)
        assert words in text, text
    (folder / "model.safetensors.index.json").write_text("{]")
    assert "model.safetensors.index.json: not valid JSON" in _refusal(folder)


def test_logits_match_transformers_both_ways(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=29, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=24,
        rms_norm_eps=1e-6, rope_theta=300.0, tie_word_embeddings=False)
    theirs = transformers.LlamaForCausalLM(hf_cfg).eval()
    theirs.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ours = nn.Llama.from_pretrained(tmp_path / "hf", dtype=np.float32)
    idx = _idx(29)
    with torch.no_grad():
        want = theirs(torch.from_numpy(idx)).logits.double().numpy()
    np.testing.assert_allclose(_logits(ours, idx), want, rtol=1e-4, atol=1e-5)
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        got = again(torch.from_numpy(idx)).logits.double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
