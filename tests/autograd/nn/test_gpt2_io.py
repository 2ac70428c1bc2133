"""GPT-2 folders: the activation option, save/load round trips, the exact Hugging Face
layout, a float64 NumPy GPT-2 forward read straight from the written file, and (where
transformers and torch are installed) logits against transformers' GPT2LMHeadModel."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import safetensors

import gpuplan as gp
from autograd import nn
from autograd.nn import gpt2_io
from autograd.nn.gpt2_io import GPT2FormatError
from gpuplan.dtypes import bfloat16

SMALL = dict(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=8)


def _idx(cfg, B=2, T=None, seed=0):
    T = cfg.block_size if T is None else T
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, T), dtype=np.int64)


def _logits(model, idx):
    return gp.to_host(model(idx).data).astype(np.float64)


def _expected_names(n_layer, tied=True):
    """GPT-2's documented layout (GPT2LMHeadModel.state_dict() minus the tied lm_head)."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        names += [f"transformer.h.{i}.{m}.{leaf}"
                  for m in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc",
                            "mlp.c_proj") for leaf in ("weight", "bias")]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    return names + ([] if tied else ["lm_head.weight"])


def _read_raw(path):
    """name -> (safetensors dtype code, shape, float64 array) straight from the file."""
    codes = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": bfloat16}
    out = {}
    for name, view in safetensors.deserialize(path.read_bytes()):
        arr = np.frombuffer(view["data"], codes[view["dtype"]]).reshape(view["shape"])
        out[name] = (view["dtype"], tuple(view["shape"]), arr.astype(np.float64))
    return out


def _reference_gpt2(w, hf, idx):
    """GPT-2 (tanh GELU) in float64 NumPy from HF-named weights and config.json."""
    C, H = hf["n_embd"], hf["n_head"]
    eps = hf["layer_norm_epsilon"]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        if hf["activation_function"] == "gelu_new":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))

    B, T = idx.shape
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:T]
    mask = np.triu(np.ones((T, T), bool), 1)
    for i in range(hf["n_layer"]):
        p = f"transformer.h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
                   for a in np.split(qkv, 3, axis=-1))
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(C // H)
        att = np.where(mask, -np.inf, att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    head = w.get("lm_head.weight", w["transformer.wte.weight"])
    return x @ head.T


def test_activation_option_selects_the_gelu_form():
    exact = nn.GPT(nn.GPTConfig(**SMALL))
    tanh = nn.GPT(nn.GPTConfig(**SMALL, activation="gelu_tanh"))
    assert exact.blocks[0].mlp.act.approximate == "none"
    assert tanh.blocks[0].mlp.act.approximate == "tanh"
    idx = _idx(exact.config)
    a, b = _logits(exact, idx), _logits(tanh, idx)
    assert not np.array_equal(a, b) and np.allclose(a, b, atol=1e-3)  # same weights
    with pytest.raises(ValueError, match="activation must be one of .* given 'relu'"):
        nn.GPTConfig(**SMALL, activation="relu")


def test_tanh_activation_on_the_device_matches_the_host(device):
    """The fused linear + tanh-GELU GEMM epilogue on the device agrees with the host."""
    host = nn.GPT(nn.GPTConfig(**SMALL, activation="gelu_tanh", seed=1))
    model = nn.GPT(nn.GPTConfig(**SMALL, activation="gelu_tanh", seed=1)).to(device=device)
    idx = _idx(host.config)
    got = _logits(model, gp.to_device(idx, gp.backend.resolve_device(device)))
    np.testing.assert_allclose(got, _logits(host, idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [dict(activation="gelu_tanh"),
                                     dict(activation="gelu", tie_weights=False)])
def test_saved_folder_has_gpt2_layout_and_matches_a_numpy_gpt2(tmp_path, options):
    model = nn.GPT(nn.GPTConfig(**SMALL, **options, seed=3))
    folder = model.save_pretrained_gpt2(tmp_path / "gpt2")
    hf = json.loads((folder / "config.json").read_text())
    assert hf["model_type"] == "gpt2" and hf["architectures"] == ["GPT2LMHeadModel"]
    assert hf["activation_function"] == ("gelu_new" if options["activation"] == "gelu_tanh"
                                         else "gelu")
    assert (hf["n_embd"], hf["n_layer"], hf["n_head"], hf["n_positions"], hf["vocab_size"]) \
        == (8, 2, 2, 12, 23)
    assert hf["tie_word_embeddings"] == options.get("tie_weights", True)
    raw = _read_raw(folder / "model.safetensors")
    tied = options.get("tie_weights", True)
    assert sorted(raw) == sorted(_expected_names(2, tied))
    assert gpt2_io.hf_names(2, tied) == _expected_names(2, tied)
    C, V = 8, 23
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (12, C),
              "transformer.h.1.attn.c_attn.weight": (C, 3 * C),
              "transformer.h.1.attn.c_attn.bias": (3 * C,),
              "transformer.h.0.attn.c_proj.weight": (C, C),
              "transformer.h.0.mlp.c_fc.weight": (C, 4 * C),
              "transformer.h.0.mlp.c_proj.weight": (4 * C, C),
              "transformer.ln_f.bias": (C,)}
    if not tied:
        shapes["lm_head.weight"] = (V, C)
    for name, shape in shapes.items():
        assert raw[name][:2] == ("F32", shape), name
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}  # transformers refuses files without it
    weights = {n: a for n, (_, _, a) in raw.items()}
    idx = _idx(model.config, T=9)
    np.testing.assert_allclose(_logits(model, idx), _reference_gpt2(weights, hf, idx),
                               rtol=1e-4, atol=1e-4)
    loaded = nn.GPT.from_pretrained_gpt2(folder)
    assert loaded.config == model.config.__class__(**{**SMALL, **options})
    assert np.array_equal(_logits(loaded, idx), _logits(model, idx))
    assert not loaded.training  # eval mode, as transformers' from_pretrained


def test_from_pretrained_is_in_eval_mode_so_dropout_does_not_change_logits(tmp_path):
    folder = nn.GPT(nn.GPTConfig(**SMALL)).save_pretrained_gpt2(tmp_path / "m")
    loaded = nn.GPT.from_pretrained_gpt2(folder, dropout=0.5)
    idx = _idx(loaded.config, T=7)
    assert np.array_equal(_logits(loaded, idx), _logits(loaded, idx))
    assert loaded.train().training  # and it trains when asked


def test_round_trip_keeps_bf16_and_crops_positions(tmp_path):
    model = nn.GPT(nn.GPTConfig(**SMALL, activation="gelu_tanh")).to(dtype=bfloat16)
    folder = model.save_pretrained_gpt2(tmp_path / "bf16")
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {v[0] for v in _read_raw(folder / "model.safetensors").values()} == {"BF16"}
    loaded = nn.GPT.from_pretrained_gpt2(folder, dtype=bfloat16)
    for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert q.dtype == bfloat16 and np.array_equal(p.data.view(np.uint16),
                                                      q.data.view(np.uint16)), n
    short = nn.GPT.from_pretrained_gpt2(folder, block_size=5)
    assert short.config.block_size == 5 and short.wpe.weight.shape == (5, 8)
    np.testing.assert_array_equal(short.wpe.weight.data,
                                  model.wpe.weight.data[:5].astype(np.float32))
    with pytest.raises(GPT2FormatError, match=r"block_size must lie in \[1, 12\]"):
        nn.GPT.from_pretrained_gpt2(folder, block_size=13)


def test_older_files_without_prefix_and_with_mask_buffers_load(tmp_path):
    model = nn.GPT(nn.GPTConfig(**SMALL, activation="gelu_tanh"))
    folder = model.save_pretrained_gpt2(tmp_path / "new")
    tensors = {n[len("transformer."):]: a for n, (_, _, a) in
               _read_raw(folder / "model.safetensors").items()}
    for i in range(2):  # the causal-mask buffers old transformers versions saved
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 12, 12)))
        tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4)
    tensors["lm_head.weight"] = tensors["wte.weight"]
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((folder / "config.json").read_text())
    safetensors.numpy.save_file({k: v.astype(np.float32) for k, v in tensors.items()},
                                str(old / "model.safetensors"))
    idx = _idx(model.config)
    assert np.array_equal(_logits(nn.GPT.from_pretrained_gpt2(old), idx), _logits(model, idx))


def test_unsupported_configs_and_bad_folders_raise_one_clear_error(tmp_path):
    with pytest.raises(GPT2FormatError, match="GPT-2 has biases"):
        nn.GPT(nn.GPTConfig(**SMALL, bias=False)).save_pretrained_gpt2(tmp_path / "nobias")
    assert not (tmp_path / "nobias").exists()
    with pytest.raises(GPT2FormatError, match="config.json is missing"):
        nn.GPT.from_pretrained_gpt2(tmp_path)
    folder = nn.GPT(nn.GPTConfig(**SMALL)).save_pretrained_gpt2(tmp_path / "ok")
    hf = json.loads((folder / "config.json").read_text())
    for field, value, message in [
            ("activation_function", "relu", "activation_function 'relu' is not supported"),
            ("n_inner", 7, "n_inner 7 is not supported .*expected null or 4 \\* n_embd"),
            ("layer_norm_epsilon", 1e-6, "layer_norm_epsilon 1e-06 is not supported"),
            ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx"),
            ("model_type", "llama", "model_type 'llama'"),
            ("n_embd", 16, "wte.weight has shape \\(23, 8\\), the config implies \\(23, 16\\)")]:
        (folder / "config.json").write_text(json.dumps({**hf, field: value}))
        with pytest.raises(GPT2FormatError, match=message):
            nn.GPT.from_pretrained_gpt2(folder)


def test_logits_match_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=23, n_positions=12, n_embd=8, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    theirs = transformers.GPT2LMHeadModel(hf_cfg).eval()
    theirs.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ours = nn.GPT.from_pretrained_gpt2(tmp_path / "hf")
    idx = _idx(ours.config)
    with torch.no_grad():
        want = theirs(torch.from_numpy(idx)).logits.double().numpy()
    np.testing.assert_allclose(_logits(ours, idx), want, rtol=1e-4, atol=1e-4)
    ours.save_pretrained_gpt2(tmp_path / "ours")
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        got = again(torch.from_numpy(idx)).logits.double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dropout_fields_map_to_gpt2_pdrops():
    """resid/embd_pdrop carry dropout and attn_pdrop the attention dropout (dropout's value
    when attn_dropout is None); reading gives back the same config."""
    from autograd.nn import gpt2_io

    for options, attn in ((dict(dropout=0.1), 0.1), (dict(dropout=0.1, attn_dropout=0.25), 0.25),
                          (dict(attn_dropout=0.2), 0.2)):
        cfg = nn.GPTConfig(**SMALL, **options)
        hf = gpt2_io.gpt2_config_json(cfg)
        assert (hf["resid_pdrop"], hf["embd_pdrop"], hf["attn_pdrop"]) == (
            cfg.dropout, cfg.dropout, attn)
        assert gpt2_io.config_from_gpt2(hf) == nn.GPTConfig(
            **SMALL, **options, activation=cfg.activation)


def test_save_pretrained_never_writes_through_a_link_out_of_its_folder(tmp_path):
    """Before: a config.json linked outside the folder was written through."""
    from gpuplan.confined_write import LinkOutsideError

    model = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4))
    folder, outside = tmp_path / "gpt2", tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_text("keep")
    (folder / ".model.safetensors.tmp").symlink_to(outside)  # the old temporary name
    model.save_pretrained_gpt2(folder)
    assert outside.read_text() == "keep"
    for name in ("config.json", "model.safetensors"):
        (folder / name).unlink()
        (folder / name).symlink_to(outside)
        with pytest.raises(LinkOutsideError, match=f"{name}: resolves to"):
            model.save_pretrained_gpt2(folder)
        assert outside.read_text() == "keep"
        (folder / name).unlink()


@pytest.mark.parametrize("patch,message", [
    ({"n_embd": [8]}, r"n_embd must be an integer in \[1, 2\*\*31\), given \[8\]"),
    ({"vocab_size": None}, r"vocab_size must be an integer in \[1, 2\*\*31\), given None"),
    ({"n_embd": float("inf")}, r"n_embd must be an integer .* given inf"),  # OverflowError
    ({"n_embd": 2**40}, r"n_embd must be an integer .* given 1099511627776"),
    ({"n_head": True}, r"n_head must be an integer .* given True"),  # was accepted as 1
    ({"n_positions": "12"}, r"n_positions must be an integer .* given '12'"),
    ({"layer_norm_epsilon": "a"}, r"layer_norm_epsilon must be a finite number, given 'a'"),
    ({"resid_pdrop": 3.0}, r"resid_pdrop must be a probability in \[0, 1\], given 3.0"),
    ({"tie_word_embeddings": "no"}, r"tie_word_embeddings must be true or false, given 'no'"),
    ({"scale_attn_weights": 1}, r"scale_attn_weights must be true or false, given 1"),
    ("[" * 100000 + "]" * 100000, r"JSON nested too deeply"),  # was RecursionError
])
def test_malformed_config_values_are_one_line_naming_file_and_field(tmp_path, patch, message):
    """Before: TypeError, OverflowError and RecursionError tracebacks, or accepted."""
    folder = nn.GPT(nn.GPTConfig(**SMALL)).save_pretrained_gpt2(tmp_path / "m")
    hf = json.loads((folder / "config.json").read_text())
    text = patch if isinstance(patch, str) else json.dumps({**hf, **patch})
    (folder / "config.json").write_text(text)
    with pytest.raises(GPT2FormatError, match=message) as info:
        nn.GPT.from_pretrained_gpt2(folder)
    assert str(info.value).startswith(str(folder / "config.json")) and "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_or_bool_weights_are_refused(tmp_path, dtype):
    """Before: int64 or bool tensors were cast to floats and loaded as weights."""
    from autograd import serialization

    folder = nn.GPT(nn.GPTConfig(**SMALL)).save_pretrained_gpt2(tmp_path / "m")
    tensors = serialization.read_safetensors(folder / "model.safetensors")[0]
    tensors["transformer.wte.weight"] = tensors["transformer.wte.weight"].astype(dtype)
    serialization.save(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(GPT2FormatError, match=f"wte.weight is stored as {np.dtype(dtype)}, "
                                              f"expected a float dtype"):
        nn.GPT.from_pretrained_gpt2(folder)
