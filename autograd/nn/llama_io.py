"""Hugging Face Llama folders (config.json + model.safetensors, or a sharded
model.safetensors.index.json) to and from `nn.Llama`.

nn.Llama's parameters carry transformers' LlamaForCausalLM names without the ``model.``
prefix; its Linear weights are stored ``[in, out]`` where transformers stores ``[out, in]``,
so every ``*_proj.weight`` and ``lm_head.weight`` is transposed on the way, nothing else:

    model.embed_tokens.weight [V, C]            embed_tokens.weight [V, C]
    model.layers.{i}.self_attn.q_proj.weight    layers.{i}.self_attn.q_proj.weight
      [H Dh, C] (k, v: [Hkv Dh, C]; o: [C, H Dh])   [C, H Dh] (and k, v, o transposed)
    model.layers.{i}.mlp.{gate,up,down}_proj    layers.{i}.mlp.*_proj, transposed
    model.layers.{i}.*_layernorm, model.norm    the same names without model., [C]
    lm_head.weight [V, C] (untied only)         lm_head.weight [C, V]

No permutation of the q/k projections is needed: transformers' files hold them in the
rotate-half layout its RoPE uses (its Meta-checkpoint converter permutes Meta's interleaved
pairs into it), and our RoPE is rotate-half too (dimension i pairs with i + Dh/2 inside each
head, head h being output columns ``h Dh .. (h+1) Dh``).

Options nn.Llama does not implement (rope scaling of any kind, partial rotary embeddings,
attention or MLP biases, sliding windows, a head_dim unlike hidden_size /
num_attention_heads, an activation other than SiLU, quantization) raise `LlamaFormatError`
naming the option.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autograd import serialization
from autograd.nn.llama_config import LlamaConfig
from gpuplan.confined_write import atomic_write, check_inside
from gpuplan.dtypes import as_dtype, bfloat16

if TYPE_CHECKING:
    from autograd.nn.llama import Llama

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_PREFIX = "model."
_FLOATS = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
           bfloat16: "bfloat16", np.dtype(np.float64): "float64"}
_MAX_JSON_BYTES = 64 << 20  # a config is ~1 KB, a 400-shard index ~100 KB
# RoPE tables older transformers versions saved as buffers: derived from the config.
_IGNORED_SUFFIX = "self_attn.rotary_emb.inv_freq"


class LlamaFormatError(ValueError):
    """A Llama folder or config that nn.Llama cannot represent; the message names what."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _listed(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


class _ConfigReader:
    """Typed reads of a config.json's fields, each error one line naming the file, the field,
    what was expected and what was given."""

    def __init__(self, hf: dict[str, Any], where: str) -> None:
        self.hf, self.where = hf, where

    def unsupported(self, field: str, expected: str) -> LlamaFormatError:
        return LlamaFormatError(f"{self.where}: {field} {_short(self.hf.get(field))} is not "
                                f"supported by nn.Llama (expected {expected})")

    def int(self, field: str, default: int | None) -> int:
        value = self.hf.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
            raise LlamaFormatError(f"{self.where}: {field} must be an integer in [1, 2**31), "
                                   f"given {_short(self.hf.get(field))}")
        return value

    def real(self, field: str, default: float) -> float:
        value = self.hf.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise LlamaFormatError(f"{self.where}: {field} must be a finite number, given "
                                   f"{_short(self.hf.get(field))}")
        return float(value)

    def flag(self, field: str, default: bool) -> bool:
        value = self.hf.get(field, default)
        if not isinstance(value, bool):
            raise LlamaFormatError(f"{self.where}: {field} must be true or false, given "
                                   f"{_short(value)}")
        return value

    def require(self, field: str, allowed: tuple[Any, ...], expected: str) -> None:
        """`field` absent or one of `allowed`, else the unsupported-option error."""
        if field in self.hf and self.hf[field] not in allowed:
            raise self.unsupported(field, expected)


def _rope_theta(read: _ConfigReader) -> float:
    """rope_theta of the config; unscaled RoPE only (rope_scaling null or of rope_type
    "default"; transformers 5's rope_parameters likewise)."""
    hf = read.hf
    for field in ("rope_scaling", "rope_parameters"):
        value = hf.get(field)
        if value is None:
            continue
        kind = value.get("rope_type", value.get("type")) if isinstance(value, dict) else None
        if kind != "default":
            raise read.unsupported(field, "null or rope_type 'default' (nn.Llama implements "
                                          "unscaled RoPE only)")
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return _ConfigReader(params, f"{read.where}: rope_parameters").real("rope_theta",
                                                                            10000.0)
    return read.real("rope_theta", 10000.0)


def config_from_hf(hf: dict[str, Any], where: str = CONFIG_FILE, **overrides: Any
                   ) -> LlamaConfig:
    """The LlamaConfig of a LlamaForCausalLM config.json's fields (transformers' defaults
    for absent ones); LlamaFormatError for options nn.Llama does not implement or values of
    the wrong type. `overrides` (block_size, dropout, dtype, seed) replace derived fields."""
    read = _ConfigReader(hf, where)
    read.require("model_type", ("llama",), "'llama'")
    read.require("hidden_act", ("silu", "swish"), "'silu'")
    for field in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if read.flag(field, False):
            raise read.unsupported(field, "false")
    read.require("sliding_window", (None,), "null: nn.Llama attends to every earlier token")
    read.require("quantization_config", (None,), "null: nn.Llama loads float weights only")
    read.require("partial_rotary_factor", (None, 1, 1.0), "1: RoPE rotates whole heads")
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or
                                    any(t != "full_attention" for t in layer_types)):
        raise read.unsupported("layer_types", "null or every layer 'full_attention'")
    theta = _rope_theta(read)
    n_embd, n_head = read.int("hidden_size", 4096), read.int("num_attention_heads", 32)
    if hf.get("head_dim") is not None and (n_embd % n_head or
                                           read.int("head_dim", None) != n_embd // n_head):
        raise read.unsupported("head_dim", f"null or hidden_size / num_attention_heads = "
                                           f"{n_embd / n_head:g}")
    if hf.get("pretraining_tp") is not None:
        read.int("pretraining_tp", 1)  # any value: it splits the same matmuls (same math)
    dropout = read.real("attention_dropout", 0.0)
    kv = hf.get("num_key_value_heads")
    fields = dict(vocab_size=read.int("vocab_size", 32000),
                  block_size=read.int("max_position_embeddings", 2048),
                  n_layer=read.int("num_hidden_layers", 32), n_head=n_head, n_embd=n_embd,
                  n_kv_head=n_head if kv is None else read.int("num_key_value_heads", None),
                  ffn_hidden=read.int("intermediate_size", 11008), rope_theta=theta,
                  norm_eps=read.real("rms_norm_eps", 1e-6),
                  tie_weights=read.flag("tie_word_embeddings", False), dropout=dropout)
    fields.update(overrides)
    try:
        return LlamaConfig(**fields)
    except ValueError as exc:
        raise LlamaFormatError(f"{where}: {exc}") from None


def hf_config_json(config: LlamaConfig, dtype: Any = None) -> dict[str, Any]:
    """A config.json for `config` that transformers' LlamaConfig reads (as
    LlamaForCausalLM.save_pretrained writes it); ``torch_dtype`` names `dtype` (default: the
    config's)."""
    dtype = as_dtype(config.dtype if dtype is None else dtype)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config.vocab_size, "hidden_size": config.n_embd,
        "intermediate_size": config.hidden, "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head, "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.block_size, "rms_norm_eps": config.norm_eps,
        "rope_theta": float(config.rope_theta), "rope_scaling": None,
        "attention_bias": False, "attention_dropout": config.dropout, "mlp_bias": False,
        "tie_word_embeddings": config.tie_weights, "initializer_range": 0.02,
        "pretraining_tp": 1, "use_cache": True, "torch_dtype": _FLOATS[dtype],
    }


def hf_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes LlamaForCausalLM.save_pretrained writes for `config`
    (transformers' ``[out, in]`` layout; no ``lm_head.weight`` when tied)."""
    C, V, F = config.n_embd, config.vocab_size, config.hidden
    q, kv = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, C)}
    for i in range(config.n_layer):
        L = f"model.layers.{i}."
        out.update({
            L + "input_layernorm.weight": (C,),
            L + "self_attn.q_proj.weight": (q, C), L + "self_attn.k_proj.weight": (kv, C),
            L + "self_attn.v_proj.weight": (kv, C), L + "self_attn.o_proj.weight": (C, q),
            L + "post_attention_layernorm.weight": (C,),
            L + "mlp.gate_proj.weight": (F, C), L + "mlp.up_proj.weight": (F, C),
            L + "mlp.down_proj.weight": (C, F)})
    out["model.norm.weight"] = (C,)
    if not config.tie_weights:
        out["lm_head.weight"] = (V, C)
    return out


def _transposed(hf_name: str) -> bool:
    return hf_name.endswith("_proj.weight") or hf_name == "lm_head.weight"


def _ours(hf_name: str) -> str:
    return hf_name[len(_PREFIX):] if hf_name.startswith(_PREFIX) else hf_name


def state_from_hf(tensors: dict[str, np.ndarray], config: LlamaConfig, where: str = ""
                  ) -> dict[str, np.ndarray]:
    """nn.Llama's state dict (our names, ``[in, out]``) from a LlamaForCausalLM file's
    tensors (names with or without the ``model.`` prefix of the base model); one-line
    LlamaFormatError listing missing, unexpected and misshapen tensors."""
    given: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        full = name if name.startswith(_PREFIX) or name == "lm_head.weight" else _PREFIX + name
        if not full.endswith(_IGNORED_SUFFIX):
            given[full] = value
    expected = hf_shapes(config)
    head = given.get("lm_head.weight") if config.tie_weights else None
    if head is not None:  # tied: a copy of the embedding is tolerated, as transformers ties it
        embed = given.get("model.embed_tokens.weight")
        if embed is None or head.shape != embed.shape or not np.array_equal(
                np.asarray(head, np.float64), np.asarray(embed, np.float64)):
            raise LlamaFormatError(f"{where}: tie_word_embeddings is true but lm_head.weight "
                                   f"differs from model.embed_tokens.weight")
        del given["lm_head.weight"]
    missing = [n for n in expected if n not in given]
    unexpected = [n for n in given if n not in expected]
    if missing or unexpected:
        raise LlamaFormatError(f"{where}: tensors do not match the config: missing "
                               f"[{_listed(missing)}], unexpected [{_listed(unexpected)}]")
    misshapen = [f"{n} {tuple(given[n].shape)} (expected {s})" for n, s in expected.items()
                 if tuple(given[n].shape) != s]
    if misshapen:
        raise LlamaFormatError(f"{where}: tensor shapes do not match the config: "
                               f"{_listed(misshapen, 4)}")
    not_float = [f"{n} ({given[n].dtype})" for n in expected
                 if as_dtype(given[n].dtype) not in _FLOATS]
    if not_float:
        raise LlamaFormatError(f"{where}: tensors must be float32, float16, bfloat16 or "
                               f"float64, given {_listed(not_float, 4)}")
    return {_ours(n): np.ascontiguousarray(given[n].T) if _transposed(n) else given[n]
            for n in expected}


def state_to_hf(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LlamaForCausalLM tensor names -> arrays (``[out, in]``) for nn.Llama's `state`."""
    out: dict[str, np.ndarray] = {}
    for name, value in state.items():
        hf = name if name == "lm_head.weight" else _PREFIX + name
        out[hf] = np.ascontiguousarray(value.T if _transposed(hf) else value)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    if path.stat().st_size > _MAX_JSON_BYTES:
        raise LlamaFormatError(f"{path}: {path.stat().st_size} bytes, expected at most "
                               f"{_MAX_JSON_BYTES}")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise LlamaFormatError(f"{path}: not valid JSON ({type(exc).__name__}: "
                               f"{str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise LlamaFormatError(f"{path}: expected a JSON object, given "
                               f"{type(value).__name__}")
    return value


def _read_sharded(folder: Path) -> dict[str, np.ndarray]:
    """The tensors of the shards a model.safetensors.index.json maps, each name checked to
    lie in the shard the index names (and each shard a file of `folder` itself)."""
    index_path = folder / INDEX_FILE
    weight_map = _read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise LlamaFormatError(f"{index_path}: weight_map must map tensor names to shard "
                               f"file names, given {_short(weight_map)}")
    by_file: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, set()).add(name)
    tensors: dict[str, np.ndarray] = {}
    for file, names in by_file.items():
        shard = folder / file
        if Path(file).name != file or file in ("", ".", "..") or not shard.is_file():
            raise LlamaFormatError(f"{index_path}: shard {file!r} is not a file in {folder}")
        check_inside(shard, folder)
        found = serialization.read_safetensors(shard)[0]
        absent, extra = sorted(names - found.keys()), sorted(found.keys() - names)
        if absent or extra:
            raise LlamaFormatError(f"{shard}: does not hold what {INDEX_FILE} maps to it: "
                                   f"missing [{_listed(absent)}], not in the index "
                                   f"[{_listed(extra)}]")
        tensors.update(found)
    return tensors


def read_llama_folder(path: str | os.PathLike
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    """(config.json fields, tensors by name, where they came from) of a Llama folder:
    model.safetensors when present (as transformers prefers it), else the shards of
    model.safetensors.index.json."""
    folder = Path(path)
    cfg_file = folder / CONFIG_FILE
    if not cfg_file.is_file():
        raise LlamaFormatError(f"{folder}: not a Llama folder ({CONFIG_FILE} is missing)")
    hf = _read_json(cfg_file)
    if (folder / WEIGHTS_FILE).is_file():
        return hf, serialization.read_safetensors(folder / WEIGHTS_FILE)[0], \
            str(folder / WEIGHTS_FILE)
    if (folder / INDEX_FILE).is_file():
        return hf, _read_sharded(folder), str(folder / INDEX_FILE)
    raise LlamaFormatError(f"{folder}: no weights (expected {WEIGHTS_FILE} or {INDEX_FILE})")


def load_llama(path: str | os.PathLike, **overrides: Any
               ) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """(config, nn.Llama state dict) of the Llama folder `path` (see
    `Llama.from_pretrained`, which builds the model)."""
    hf, tensors, where = read_llama_folder(path)
    config = config_from_hf(hf, str(Path(path) / CONFIG_FILE), **overrides)
    return config, state_from_hf(tensors, config, where)


def save_llama(model: Llama, path: str | os.PathLike) -> Path:
    """Write `model` as a folder transformers' LlamaForCausalLM.from_pretrained loads:
    config.json + model.safetensors in the model's dtype (no lm_head.weight when tied)."""
    state = model.state_dict()
    dtype = next(iter(state.values())).dtype
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS_FILE, CONFIG_FILE):  # never written through a link out of it
        check_inside(folder / name, folder)
    # transformers refuses safetensors files whose metadata lacks a known "format".
    serialization.save(state_to_hf(state), folder / WEIGHTS_FILE, metadata={"format": "pt"})
    hf = hf_config_json(model.config, dtype)
    atomic_write(folder / CONFIG_FILE, (json.dumps(hf, indent=2) + "\n").encode(), folder)
    return folder


__all__ = ["LlamaFormatError", "config_from_hf", "hf_config_json", "hf_shapes", "load_llama",
           "read_llama_folder", "save_llama", "state_from_hf", "state_to_hf"]
