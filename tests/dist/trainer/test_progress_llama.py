"""dist.trainer.progress.flops_per_token for a Llama: every parameter is a weight that each
token multiplies (no learned position embedding to leave out, as GPT's)."""

from __future__ import annotations

from autograd import nn
from dist.models.configs import num_parameters
from dist.trainer.progress import flops_per_token


def test_llama_flops_count_every_parameter_and_gpt_leaves_out_its_positions():
    shape = dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=16)
    llama, gpt = nn.LlamaConfig(**shape, n_kv_head=2, ffn_hidden=24), nn.GPTConfig(**shape)
    attention = 12.0 * 2 * 8 * 16  # 12 L T C at T = 8
    assert flops_per_token(llama, num_parameters(llama), 8) == \
        6.0 * num_parameters(llama) + attention
    assert flops_per_token(gpt, num_parameters(gpt), 8) == \
        6.0 * (num_parameters(gpt) - 32 * 16) + attention
