"""The model configs a parallel model, a checkpoint or the main job holds (`nn.GPTConfig`,
`nn.LlamaConfig`): their kind, their JSON, and the fields that change the function the
model computes (those a resumed or initialising checkpoint must agree on).

A config's JSON is its fields with the dtype by name; a Llama's also has ``"model":
"llama"`` (a GPT's has no ``model`` key: the checkpoints written before Llama existed)."""

from __future__ import annotations

from typing import Any

from autograd.nn import GPTConfig, LlamaConfig
from gpuplan.dtypes import as_dtype

#: config class -> the kind recorded in its JSON
KINDS: dict[str, type] = {"gpt": GPTConfig, "llama": LlamaConfig}

#: GPTConfig fields that change the parameters or the function the model computes.
GPT_MODEL_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias",
                    "tie_weights", "activation")
#: LlamaConfig fields likewise (n_kv_head and ffn_hidden compared by the values they give).
LLAMA_MODEL_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_kv_head",
                      "ffn_hidden", "rope_theta", "norm_eps", "tie_weights")


def kind_of(config: Any) -> str:
    """"gpt" or "llama"; TypeError naming the type of anything else."""
    for kind, cls in KINDS.items():
        if isinstance(config, cls):
            return kind
    raise TypeError(f"kind_of: config must be a GPTConfig or a LlamaConfig, given "
                    f"{type(config).__name__}")


def saved_kind(fields: dict[str, Any]) -> str:
    """The kind a config's JSON records ("gpt" without a ``model`` key); ValueError naming
    an unknown one."""
    kind = fields.get("model", "gpt")
    if kind not in KINDS:
        raise ValueError(f"the model config's model must be one of {sorted(KINDS)}, given "
                         f"{str(kind)[:40]!r}")
    return kind


def config_json(config: Any) -> dict[str, Any]:
    """A GPTConfig's or LlamaConfig's fields as JSON (dtype by name; a Llama's marked)."""
    kind = kind_of(config)
    out = {k: getattr(config, k) for k in config.__dataclass_fields__}
    out["dtype"] = as_dtype(out["dtype"]).name
    return out if kind == "gpt" else {"model": kind, **out}


def llama_config_from_json(fields: dict[str, Any]) -> LlamaConfig:
    """The LlamaConfig of a Llama config's JSON; ValueError naming an unknown field, the
    dtype, or the rule a value breaks."""
    fields = {k: v for k, v in fields.items() if k != "model"}
    unknown = sorted(str(k) for k in fields if k not in LlamaConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"the model config has fields LlamaConfig does not have: "
                         f"{unknown[:3]}")
    try:
        fields["dtype"] = as_dtype(fields.get("dtype", "float32"))
    except (TypeError, ValueError):
        raise ValueError(f"the model config's dtype must name a float dtype, given "
                         f"{str(fields.get('dtype'))[:40]!r}") from None
    try:
        return LlamaConfig(**fields)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def config_differences(saved: dict[str, Any], config: Any) -> list[tuple[str, Any, Any]]:
    """(field, saved value, this config's value) for every model field on which a saved
    config's JSON and `config` differ; the kind first (``model``) when they are not the
    same kind of model. A GPT's missing activation is "gelu" (older checkpoints); a Llama's
    n_kv_head and ffn_hidden are compared by the head count and width they give."""
    theirs, mine = saved_kind(saved), kind_of(config)
    if theirs != mine:
        return [("model", theirs, mine)]
    if mine == "gpt":
        differ = [(name, saved.get(name, "gelu" if name == "activation" else None),
                   getattr(config, name)) for name in GPT_MODEL_FIELDS]
    else:
        saved_config = llama_config_from_json(saved)
        differ = [(name, _llama_value(saved_config, name), _llama_value(config, name))
                  for name in LLAMA_MODEL_FIELDS]
    return [(name, a, b) for name, a, b in differ if a != b]


def num_parameters(config: Any) -> int:
    """How many parameters the dense model of `config` has (computed, nothing allocated)."""
    if kind_of(config) == "gpt":
        return config.num_parameters()
    C, V, F = config.n_embd, config.vocab_size, config.hidden
    kv = config.kv_heads * config.head_dim
    block = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * F  # 2 norms, q/o, k/v, gate/up/down
    return V * C + config.n_layer * block + C + (0 if config.tie_weights else C * V)


def _llama_value(config: LlamaConfig, name: str) -> Any:
    return {"n_kv_head": config.kv_heads, "ffn_hidden": config.hidden}.get(
        name, getattr(config, name))


__all__ = ["GPT_MODEL_FIELDS", "KINDS", "LLAMA_MODEL_FIELDS", "config_differences",
           "config_json", "kind_of", "llama_config_from_json", "num_parameters",
           "saved_kind"]
