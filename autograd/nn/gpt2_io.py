"""Hugging Face GPT-2 folders (config.json + model.safetensors) to and from `nn.GPT`.

nn.GPT lays its weights out as GPT-2 does: HF's ``Conv1D`` stores ``[in, out]`` like our
Linear, ``c_attn``'s columns are ``[q | k | v]`` with heads contiguous inside each third,
and the head is tied to ``wte``. Only the names differ:

    transformer.wte / wpe / ln_f.*            wte / wpe / ln_f.*
    transformer.h.{i}.ln_1.*, ln_2.*          blocks.{i}.ln_1.*, ln_2.*
    transformer.h.{i}.attn.c_attn.*           blocks.{i}.attn.qkv.*
    transformer.h.{i}.attn.c_proj.*           blocks.{i}.attn.proj.*
    transformer.h.{i}.mlp.c_fc.*, c_proj.*    blocks.{i}.mlp.fc.*, proj.*
    lm_head.weight [V, C] (untied only)       head.weight [C, V]

GPT-2's ``activation_function`` "gelu_new" (or "gelu_pytorch_tanh") is our "gelu_tanh",
"gelu" our exact "gelu". Files written by older transformers versions name the tensors
without ``transformer.`` and hold the causal-mask buffers ``attn.bias``/``attn.masked_bias``,
which are ignored.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autograd import serialization
from autograd.nn.gpt_config import GPTConfig
from gpuplan.confined_write import atomic_write, check_inside
from gpuplan.dtypes import as_dtype, bfloat16

if TYPE_CHECKING:
    from autograd.nn.gpt import GPT

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_TANH = ("gelu_new", "gelu_pytorch_tanh")
_LN_EPS = 1e-5  # nn.LayerNorm's default, the one nn.GPT uses
_BLOCK = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "attn.qkv",
          "attn.c_proj": "attn.proj", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
_IGNORED = ("attn.bias", "attn.masked_bias")  # causal-mask buffers, not weights
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), bfloat16, np.dtype(np.float64))
_MAX_CONFIG_BYTES = 1 << 20  # a GPT-2 config.json is about 1 KB


class GPT2FormatError(ValueError):
    """A GPT-2 folder or config that nn.GPT cannot represent; the message names what."""


def hf_names(n_layer: int, tied: bool = True) -> list[str]:
    """The tensor names a GPT2LMHeadModel's model.safetensors holds, in our order."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        for ours in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            names += [f"transformer.h.{i}.{ours}.weight", f"transformer.h.{i}.{ours}.bias"]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    return names if tied else [*names, "lm_head.weight"]


def _ours(hf: str) -> str | None:
    """Our parameter name for HF tensor name `hf` (prefix stripped), or None to ignore."""
    if hf.startswith("h."):
        _, index, rest = hf.split(".", 2)
        if rest in _IGNORED:
            return None
        module, _, leaf = rest.rpartition(".")
        if module in _BLOCK:
            return f"blocks.{index}.{_BLOCK[module]}.{leaf}"
        return ""
    return hf if hf.split(".")[0] in ("wte", "wpe", "ln_f") else ""


class _Fields:
    """Typed reads of a config.json's fields: GPT2FormatError naming the file, the field,
    what was expected and what was given (never a TypeError or OverflowError)."""

    def __init__(self, hf: dict[str, Any], where: str) -> None:
        self.hf, self.where = hf, where

    def fail(self, field: str, expected: str) -> GPT2FormatError:
        return GPT2FormatError(f"{self.where}: {field} must be {expected}, given "
                               f"{_short(self.hf.get(field))}")

    def int(self, field: str, default: int, fallback: str | None = None) -> int:
        value = self.hf.get(field, self.hf.get(fallback, default) if fallback else default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
            raise self.fail(field if field in self.hf or not fallback else fallback,
                            "an integer in [1, 2**31)")
        return value

    def real(self, field: str, default: float) -> float:
        value = self.hf.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise self.fail(field, "a finite number")
        return float(value)

    def bool(self, field: str, default: bool) -> bool:
        value = self.hf.get(field, default)
        if not isinstance(value, bool):
            raise self.fail(field, "true or false")
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_from_gpt2(hf: dict[str, Any], where: str = "config.json", **overrides: Any
                     ) -> GPTConfig:
    """The GPTConfig of a GPT-2 config.json's fields; GPT2FormatError for options nn.GPT
    does not have or values of the wrong type. `overrides` (block_size, dropout, dtype,
    seed) replace the derived ones."""
    read = _Fields(hf, where)

    def bad(field: str, expected: str) -> GPT2FormatError:
        return GPT2FormatError(f"{where}: {field} {_short(hf.get(field))} is not supported "
                               f"by nn.GPT (expected {expected})")

    if hf.get("model_type", "gpt2") != "gpt2":
        raise bad("model_type", "'gpt2'")
    act = hf.get("activation_function", "gelu_new")
    if act not in (*_TANH, "gelu"):
        raise bad("activation_function", "'gelu_new', 'gelu_pytorch_tanh' or 'gelu'")
    n_embd = read.int("n_embd", 768)
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise bad("n_inner", f"null or 4 * n_embd = {4 * n_embd}")
    if abs(read.real("layer_norm_epsilon", _LN_EPS) - _LN_EPS) > 1e-12:
        raise bad("layer_norm_epsilon", f"{_LN_EPS}")
    for field, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("add_cross_attention", False)):
        if read.bool(field, want) != want:
            raise bad(field, str(want).lower())
    resid = read.real("resid_pdrop", 0.0)
    attn = read.real("attn_pdrop", resid)
    for field, p in (("resid_pdrop", resid), ("attn_pdrop", attn)):
        if not 0.0 <= p <= 1.0:
            raise read.fail(field, "a probability in [0, 1]")
    fields = dict(vocab_size=read.int("vocab_size", 50257),
                  block_size=read.int("n_positions", 1024, fallback="n_ctx"),
                  n_layer=read.int("n_layer", 12), n_head=read.int("n_head", 12),
                  n_embd=n_embd, dropout=resid,
                  attn_dropout=None if attn == resid else attn,  # None: as dropout
                  tie_weights=read.bool("tie_word_embeddings", True),
                  activation="gelu_tanh" if act in _TANH else "gelu")
    if n_embd % fields["n_head"]:
        raise read.fail("n_embd", f"a multiple of n_head {fields['n_head']}")
    fields.update(overrides)
    return GPTConfig(**fields)


def gpt2_config_json(config: GPTConfig, dtype: Any = None) -> dict[str, Any]:
    """A config.json for `config` that transformers' GPT2Config reads; GPT2FormatError for
    options GPT-2 does not have."""
    if not config.bias:
        raise GPT2FormatError("save_pretrained_gpt2: GPT-2 has biases in every Linear and "
                              "LayerNorm; a GPTConfig(bias=False) model cannot be written")
    dtype = as_dtype(config.dtype if dtype is None else dtype)
    names = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
             bfloat16: "bfloat16", np.dtype(np.float64): "float64"}
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "activation_function": "gelu_new" if config.activation == "gelu_tanh" else "gelu",
        "vocab_size": config.vocab_size, "n_positions": config.block_size,
        "n_ctx": config.block_size, "n_embd": config.n_embd, "n_layer": config.n_layer,
        "n_head": config.n_head, "n_inner": None, "layer_norm_epsilon": _LN_EPS,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": (config.dropout if config.attn_dropout is None
                       else config.attn_dropout),
        "initializer_range": 0.02, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_weights, "use_cache": True,
        "bos_token_id": config.vocab_size - 1, "eos_token_id": config.vocab_size - 1,
        "torch_dtype": names[dtype],
    }


def read_gpt2_folder(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json fields, HF tensors by name) of a GPT-2 folder; one-line errors."""
    path = Path(path)
    cfg_file, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    for needed in (cfg_file, weights):
        if not needed.is_file():
            raise GPT2FormatError(f"{path}: not a GPT-2 folder ({needed.name} is missing; "
                                  f"expected {CONFIG_FILE} and {WEIGHTS_FILE})")
    return read_gpt2_config(path), serialization.read_safetensors(weights)[0]


def read_gpt2_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config.json fields of the GPT-2 folder `path` (size and nesting bounded)."""
    cfg_file = Path(path) / CONFIG_FILE
    if cfg_file.stat().st_size > _MAX_CONFIG_BYTES:
        raise GPT2FormatError(f"{cfg_file}: {cfg_file.stat().st_size} bytes, expected a "
                              f"config of at most {_MAX_CONFIG_BYTES} bytes")
    try:
        hf = json.loads(cfg_file.read_bytes())
    except ValueError as exc:
        raise GPT2FormatError(f"{cfg_file}: not valid JSON ({exc})") from None
    except RecursionError:
        raise GPT2FormatError(f"{cfg_file}: JSON nested too deeply (expected a flat object "
                              f"of config fields)") from None
    if not isinstance(hf, dict):
        raise GPT2FormatError(f"{cfg_file}: expected a JSON object")
    return hf


def state_from_gpt2(tensors: dict[str, np.ndarray], config: GPTConfig, where: str = "",
                    crop: bool = False) -> dict[str, np.ndarray]:
    """nn.GPT's state dict from a GPT-2 file's tensors (names with or without the
    ``transformer.`` prefix); with `crop`, ``wpe`` is cut to ``config.block_size`` rows.
    GPT2FormatError naming unknown, missing or misshapen tensors."""
    out: dict[str, np.ndarray] = {}
    lm_head = None
    for name, value in tensors.items():
        bare = name[len("transformer."):] if name.startswith("transformer.") else name
        if bare == "lm_head.weight":
            lm_head = value
            continue
        ours = _ours(bare)
        if ours == "":
            raise GPT2FormatError(f"{where}: unknown tensor {name!r} for a GPT-2 model")
        if ours is not None:
            out[ours] = value
    if not config.tie_weights:
        if lm_head is None:
            raise GPT2FormatError(f"{where}: tie_word_embeddings is false but there is no "
                                  f"lm_head.weight")
        out["head.weight"] = np.ascontiguousarray(lm_head.T)
    if crop and "wpe.weight" in out:
        out["wpe.weight"] = np.ascontiguousarray(out["wpe.weight"][:config.block_size])
    expected = param_shapes(config)
    missing = [n for n in expected if n not in out]
    extra = [n for n in out if n not in expected]
    if missing or extra:
        raise GPT2FormatError(f"{where}: tensors do not match the config: missing "
                              f"{missing[:3]}, unexpected {extra[:3]}")
    for name, shape in expected.items():
        if as_dtype(out[name].dtype) not in _FLOATS:  # never ints or bools read as weights
            raise GPT2FormatError(f"{where}: {name} is stored as {out[name].dtype}, expected "
                                  f"a float dtype (float32, float16, bfloat16 or float64)")
        if tuple(out[name].shape) != shape:
            raise GPT2FormatError(f"{where}: {name} has shape {tuple(out[name].shape)}, the "
                                  f"config implies {shape}")
    return {n: out[n] for n in expected}


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """``nn.GPT(config)``'s parameter names and shapes in ``named_parameters`` order,
    computed without building the model."""
    C, V = config.n_embd, config.vocab_size
    out: dict[str, tuple[int, ...]] = {"wte.weight": (V, C),
                                       "wpe.weight": (config.block_size, C)}

    def norm(prefix: str) -> None:
        out[f"{prefix}.weight"] = (C,)
        if config.bias:
            out[f"{prefix}.bias"] = (C,)

    def linear(prefix: str, n_in: int, n_out: int) -> None:
        out[f"{prefix}.weight"] = (n_in, n_out)
        if config.bias:
            out[f"{prefix}.bias"] = (n_out,)

    for i in range(config.n_layer):
        norm(f"blocks.{i}.ln_1")
        linear(f"blocks.{i}.attn.qkv", C, 3 * C)
        linear(f"blocks.{i}.attn.proj", C, C)
        norm(f"blocks.{i}.ln_2")
        linear(f"blocks.{i}.mlp.fc", C, 4 * C)
        linear(f"blocks.{i}.mlp.proj", 4 * C, C)
    norm("ln_f")
    if not config.tie_weights:
        out["head.weight"] = (C, V)
    return out


def state_to_gpt2(state: dict[str, np.ndarray], config: GPTConfig) -> dict[str, np.ndarray]:
    """HF GPT2LMHeadModel tensor names -> arrays for nn.GPT's state dict `state`."""
    reverse = {ours: hf for hf, ours in _BLOCK.items()}
    out: dict[str, np.ndarray] = {}
    for name, value in state.items():
        if name == "head.weight":
            out["lm_head.weight"] = np.ascontiguousarray(value.T)
            continue
        if name.startswith("blocks."):
            _, index, rest = name.split(".", 2)
            module, _, leaf = rest.rpartition(".")
            name = f"h.{index}.{reverse[module]}.{leaf}"
        out[f"transformer.{name}"] = np.ascontiguousarray(value)
    return out


def load_gpt2(path: str | os.PathLike, block_size: int | None = None, **overrides: Any
              ) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """(config, nn.GPT state dict) of the GPT-2 folder `path` (see
    `GPT.from_pretrained_gpt2`, which builds the model)."""
    hf, tensors = read_gpt2_folder(path)
    positions = _Fields(hf, str(Path(path) / CONFIG_FILE)).int("n_positions", 1024,
                                                              fallback="n_ctx")
    if block_size is not None and not 0 < int(block_size) <= positions:
        raise GPT2FormatError(f"from_pretrained_gpt2: block_size must lie in [1, {positions}] "
                              f"(the folder's n_positions), given {block_size}")
    if block_size is not None:
        overrides["block_size"] = int(block_size)
    config = config_from_gpt2(hf, str(Path(path) / CONFIG_FILE), **overrides)
    return config, state_from_gpt2(tensors, config, str(Path(path) / WEIGHTS_FILE), crop=True)


def save_gpt2(model: GPT, path: str | os.PathLike) -> Path:
    """Write `model` as a GPT-2 folder that transformers' GPT2LMHeadModel loads."""
    config = model.config
    state = model.state_dict()
    dtype = next(iter(state.values())).dtype
    hf = gpt2_config_json(config, dtype)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    # Both files stay inside the folder: a config.json or model.safetensors that is a link
    # out of it is refused, never written through.
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        check_inside(folder / name, folder)
    # transformers refuses safetensors files whose metadata lacks a known "format".
    serialization.save(state_to_gpt2(state, config), folder / WEIGHTS_FILE,
                       metadata={"format": "pt"})
    atomic_write(folder / CONFIG_FILE, (json.dumps(hf, indent=2) + "\n").encode(), folder)
    return folder


__all__ = ["GPT2FormatError", "config_from_gpt2", "gpt2_config_json", "hf_names",
           "load_gpt2", "param_shapes", "read_gpt2_config", "read_gpt2_folder", "save_gpt2",
           "state_from_gpt2", "state_to_gpt2"]
