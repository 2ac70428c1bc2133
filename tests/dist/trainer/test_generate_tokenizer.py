"""dist.trainer.generate (scripts/generate.py) --tokenizer and --top-p: a tokenizer.json
written here encodes the prompt and decodes the output (the same text as the model's own
greedy generate, decoded; for a GPT and a Llama checkpoint), a tiny nucleus is greedy, and
a missing file, a missing
`tokenizers` package, an unreadable file, a vocabulary the model lacks and a bad --top-p are
one error line each (exit 2)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dist
from autograd import nn
from dist.trainer import generate

tokenizers = pytest.importorskip("tokenizers")

_TINY = dict(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, seed=3)
_WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "big", "red",
          "sun", "and", "hat", "box"]


def _checkpoint(root, llama=False):
    model = (nn.Llama(nn.LlamaConfig(**_TINY, n_kv_head=1, ffn_hidden=12)) if llama
             else nn.GPT(nn.GPTConfig(**_TINY)))
    dist.save_checkpoint(root, model, step=1,
                         metadata={"step": 1, "layout": [1, 1, 1],
                                   "args": {"codec": {"kind": "bytes", "path": None}}})
    return model


def _tokenizer(path, words=_WORDS):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return tok


def _run(capsys, *args):
    code = generate.main(["--device", "cpu", "--tokens", "5", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("llama", [False, True], ids=["gpt", "llama"])
def test_tokenizer_encodes_the_prompt_and_decodes_the_output(tmp_path, capsys, llama):
    model = _checkpoint(tmp_path / "ck", llama)
    tok = _tokenizer(tmp_path / "tokenizer.json")
    code, out, err = _run(capsys, "--checkpoint", str(tmp_path / "ck"), "--tokenizer",
                          str(tmp_path / "tokenizer.json"), "--prompt", "the cat sat",
                          "--temperature", "0")
    assert code == 0, err
    ids = np.array([tok.encode("the cat sat").ids])
    want = tok.decode([int(t) for t in model.generate(ids, 5, temperature=0.0)[0]],
                      skip_special_tokens=False)
    assert out == want + "\n" and out.startswith("the cat sat ")
    assert len(out.split()) == 8


def test_a_tiny_nucleus_is_greedy_and_top_p_reaches_sampling(tmp_path, capsys):
    _checkpoint(tmp_path / "ck")
    _tokenizer(tmp_path / "tokenizer.json")
    base = ["--checkpoint", str(tmp_path / "ck"), "--tokenizer", str(tmp_path / "tokenizer.json"),
            "--prompt", "the big dog", "--tokens", "6"]
    greedy = _run(capsys, *base, "--temperature", "0")
    assert greedy[0] == 0, greedy[2]
    nucleus = _run(capsys, *base, "--temperature", "1.5", "--top-k", "0", "--top-p", "1e-6",
                   "--seed", "5")
    assert nucleus[:2] == greedy[:2]
    draws = {_run(capsys, *base, "--temperature", "1.5", "--top-k", "0", "--seed", str(s))[1]
             for s in range(4)}
    assert len(draws) > 1  # without the nucleus the same settings do sample


@pytest.mark.parametrize("setup,args,words", [
    (None, ["--tokenizer", "{tmp}/absent.json"], "--tokenizer: no such file: {tmp}/absent.json"),
    ("garbage", ["--tokenizer", "{tmp}/bad.json"],
     "--tokenizer {tmp}/bad.json: not a tokenizer.json the tokenizers package reads"),
    ("big", ["--tokenizer", "{tmp}/big.json", "--prompt", "w40"],
     "--prompt encodes to token id 40, outside the model's vocabulary of 16"),
    (None, ["--top-p", "0"], "--top-p must lie in (0, 1] (1: no cut), given 0.0"),
    (None, ["--top-p", "1.5"], "--top-p must lie in (0, 1] (1: no cut), given 1.5"),
])
def test_errors_are_one_line(tmp_path, capsys, setup, args, words):
    _checkpoint(tmp_path / "ck")
    if setup == "garbage":
        (tmp_path / "bad.json").write_text('{"model": 3}')
    elif setup == "big":
        _tokenizer(tmp_path / "big.json", [f"w{i}" for i in range(64)])
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = _run(capsys, "--checkpoint", str(tmp_path / "ck"), *args)
    assert code == 2 and out == ""
    assert err.startswith("generate.py: error: ") and err.count("\n") == 1, err
    assert words.replace("{tmp}", str(tmp_path)) in err, err


def test_a_missing_tokenizers_package_is_named(tmp_path, capsys, monkeypatch):
    _checkpoint(tmp_path / "ck")
    _tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    code, _, err = _run(capsys, "--checkpoint", str(tmp_path / "ck"), "--tokenizer",
                        str(tmp_path / "tokenizer.json"))
    assert code == 2 and err.count("\n") == 1, err
    assert "--tokenizer needs the optional `tokenizers` package (pip install tokenizers, or " \
           "pip install -e '.[data]')" in err, err
