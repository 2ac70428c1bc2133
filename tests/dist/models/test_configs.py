"""dist.models.configs: kinds, JSON and parameter counts of GPT and Llama configs."""

from __future__ import annotations

import numpy as np
import pytest

from autograd import nn
from dist.models.configs import config_json, kind_of, llama_config_from_json, num_parameters


@pytest.mark.parametrize("cfg", [
    nn.GPTConfig(vocab_size=37, block_size=8, n_layer=3, n_head=4, n_embd=16),
    nn.GPTConfig(vocab_size=37, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=False,
                 tie_weights=False),
    *(nn.LlamaConfig(vocab_size=37, block_size=8, n_layer=3, n_head=4, n_embd=16,
                     n_kv_head=kv, ffn_hidden=24, tie_weights=tied)
      for kv in (4, 2, 1) for tied in (False, True)),
])
def test_num_parameters_counts_the_dense_model(cfg):
    model = nn.Llama(cfg) if kind_of(cfg) == "llama" else nn.GPT(cfg)
    assert num_parameters(cfg) == sum(int(np.prod(p.shape)) for p in model.parameters())


def test_llama_config_json_round_trips_and_a_gpt_config_is_unmarked():
    cfg = nn.LlamaConfig(vocab_size=37, block_size=8, n_layer=1, n_head=4, n_embd=16,
                         n_kv_head=2, rope_theta=5e5, dtype=np.float64, seed=4)
    saved = config_json(cfg)
    assert saved["model"] == "llama" and saved["dtype"] == "float64"
    assert llama_config_from_json(saved) == cfg
    assert "model" not in config_json(nn.GPTConfig(vocab_size=5, block_size=4, n_layer=1,
                                                   n_head=1, n_embd=4))
    with pytest.raises(TypeError, match="GPTConfig or a LlamaConfig, given dict"):
        kind_of({})
