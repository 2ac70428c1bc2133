"""dist.trainer.options for --model llama: its options, and the shapes a layout cannot split
as one line naming the option."""

from __future__ import annotations

import pytest

from dist.trainer import options


def _validated(args: list[str], world: int):
    ns = options.parse_args(args)
    options.validate(ns, world)
    return ns


def test_llama_options_parse_and_pass():
    ns = _validated(["--model", "llama", "--n-kv-head", "1", "--ffn-hidden", "64",
                     "--rope-theta", "500000", "--tp", "2"], 2)
    assert (ns.model, ns.n_kv_head, ns.ffn_hidden, ns.rope_theta) == ("llama", 1, 64, 5e5)
    assert _validated([], 1).model == "gpt"  # the default main job stays GPT
    # attention dropout on tensor-parallel heads draws what one process draws
    assert _validated(["--model", "llama", "--dropout", "0.1", "--tp", "2"], 2).tp == 2


@pytest.mark.parametrize("args,world,message", [
    (["--n-kv-head", "2"], 1, "--n-kv-head is an option of --model llama, given --model gpt"),
    (["--rope-theta", "1e4"], 1, "--rope-theta is an option of --model llama"),
    (["--model", "llama", "--n-kv-head", "3"], 1, "--n-kv-head must divide --n-head 4, "
                                                  "given 3"),
    (["--model", "llama", "--n-kv-head", "0"], 1, "--n-kv-head must be an integer >= 1"),
    (["--model", "llama", "--n-head", "12", "--n-embd", "96", "--n-kv-head", "4", "--tp",
      "6"], 6, "--n-kv-head must be a multiple or a divisor of --tp 6"),
    (["--model", "llama", "--n-head", "6", "--n-embd", "96", "--n-kv-head", "2", "--tp", "3"],
     3, "--n-kv-head must be a multiple or a divisor of --tp 3"),
    (["--model", "llama", "--ffn-hidden", "33", "--tp", "2"], 2,
     "--ffn-hidden 33 is not divisible by --tp 2"),
    (["--model", "llama", "--n-head", "6", "--n-embd", "96", "--tp", "3"], 3,
     "--ffn-hidden 256 (Llama's rule from --n-embd 96) is not divisible by --tp 3"),
    (["--model", "llama", "--n-head", "4", "--n-embd", "36"], 1, "even head size"),
    (["--model", "llama", "--rope-theta", "0"], 1, "--rope-theta must be a finite number > 0"),
])
def test_llama_option_errors_are_one_line(args, world, message):
    with pytest.raises(options.OptionError) as info:
        _validated(args, world)
    assert message in str(info.value) and "\n" not in str(info.value)
