"""dist.trainer.main's up-front checks: a model the options cannot build or a rank cannot
hold is one error line before anything is allocated; run metadata is checked on resume."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dist.trainer import main


def _ns(**options) -> argparse.Namespace:
    base = dict(n_layer=1, n_head=1, n_embd=16, block_size=16, dropout=0.0, attn_dropout=None,
                seed=0, activation="gelu", tp=1, pp=1, dp=1, batch_size=8, micro_batches=1,
                schedule="1f1b", device="cpu")
    return argparse.Namespace(**{**base, **options})


def test_a_model_wider_than_any_extent_is_refused_naming_the_options():
    """Before: --n-embd 2**40 passed validation and died in NumPy (MemoryError traceback)."""
    with pytest.raises(ValueError, match=r"the model options \(--n-layer, --n-head, --n-embd, "
                                         r".*GPTConfig: n_embd must be an integer"):
        main.check_model_fits(_ns(n_embd=2**40), 256)


def test_a_model_no_rank_can_hold_is_refused_with_an_estimate():
    """2e11 parameters: 3 TiB of weights, gradients and moments, more than any rank here."""
    with pytest.raises(ValueError, match=r"the model does not fit: 2.06e\+11 parameters "
                                         r"\(--n-layer 4, --n-embd 65536.* GiB per rank"):
        main.check_model_fits(_ns(n_layer=4, n_embd=65536), 256)
    main.check_model_fits(_ns(), 256)  # a small one passes


def test_the_activation_bound_grows_with_tokens_and_shrinks_with_recompute_and_tp():
    small = main.activation_bytes_lower_bound(_ns(), 256)
    assert small == 8 * 16 * 4.0 * (4 * 16 + 2 * 256)
    assert main.activation_bytes_lower_bound(_ns(block_size=32), 256) == 2 * small
    assert main.activation_bytes_lower_bound(_ns(recompute="block"), 256) < small
    assert main.activation_bytes_lower_bound(_ns(tp=2), 256) == small / 2
    with pytest.raises(ValueError, match="the activations do not fit"):
        main.check_model_fits(_ns(block_size=2**22, batch_size=2**12), 256)


def test_run_metadata_is_checked_field_by_field():
    good = {"step": 2, "scheduler": {"last_step": 2, "warmup_steps": 1, "total_steps": 2,
                                     "min_lr": 0.0, "base_lrs": [1e-3, 1e-3]},
            "history": [{"step": 2, "train_loss": 5.0, "val_loss": float("nan")}],
            "skipped": []}
    main.check_run_metadata(good, Path("m.json"))
    bad = [({"step": True}, "metadata 'step' must be an integer >= 0, given True"),
           ({"scheduler": {**good["scheduler"], "base_lrs": ["x"]}},
            "metadata 'scheduler.base_lrs' must be a list of finite numbers"),
           ({"scheduler": {**good["scheduler"], "min_lr": float("inf")}},
            "metadata 'scheduler.min_lr' must be a finite number, given inf"),
           ({"history": {"step": 1}}, "metadata 'history' must be a list of records"),
           ({"skipped": [-1]}, "metadata 'skipped' must be a list of step numbers")]
    for change, message in bad:
        with pytest.raises(ValueError, match=f"^m.json: {message}"):
            main.check_run_metadata({**good, **change}, Path("m.json"))


def test_the_final_sample_falls_back_to_ids_when_the_codec_fails(tmp_path):
    """The end of a finished run never fails it: before, a meta.pkl codec that could not
    decode (here: gone since the run started) ended a finished run with a traceback."""
    import pickle

    import numpy as np

    from autograd import nn
    from dist.trainer import data as data_mod

    folder = tmp_path / "data"
    folder.mkdir()
    ids = (np.arange(3000) % 65).astype(np.uint16)
    ids[:2700].tofile(folder / "train.bin")
    ids[2700:].tofile(folder / "val.bin")
    chars = [chr(ord("A") + i) for i in range(65)]
    (folder / "meta.pkl").write_bytes(pickle.dumps(
        {"vocab_size": 65, "itos": dict(enumerate(chars)),
         "stoi": {c: i for i, c in enumerate(chars)}}))
    corpus = data_mod.load_corpus(str(folder), 8)
    cfg = nn.GPTConfig(vocab_size=65, block_size=8, n_layer=1, n_head=1, n_embd=4)
    dense = nn.GPT(cfg).state_dict()
    text = main.final_sample(cfg, dense, 3, 0, "cpu", corpus)
    assert corpus.codec.kind == "chars" and "token ids" not in text
    (folder / "meta.pkl").unlink()
    corpus.codec._impl = None  # (as a new process would load it)
    text = main.final_sample(cfg, dense, 3, 0, "cpu", corpus)
    first, note = text.splitlines()
    assert len(first.split()) == 4 and all(t.isdigit() for t in first.split())
    assert note.startswith("(token ids: the data's chars ") and "is gone (moved?)" in note


def test_init_from_a_gpt2_folder_takes_its_shape_where_the_options_do_not_set_it(tmp_path):
    """Before: each differing field was one failed launch (vocabulary, then layers, then
    width, then activation); now the options not given follow the folder's config.json."""
    from autograd import nn
    from dist.trainer.options import parse_args

    nn.GPT(nn.GPTConfig(vocab_size=300, block_size=32, n_layer=3, n_head=2, n_embd=8,
                        activation="gelu_tanh")).save_pretrained_gpt2(tmp_path / "hf")
    ns = parse_args(["--init-from", str(tmp_path / "hf"), "--n-head", "4"])
    note = main.adopt_init_from_shape(ns)
    assert (ns.vocab_size, ns.n_layer, ns.n_head, ns.n_embd, ns.activation) == \
        (300, 3, 4, 8, "gelu_tanh")  # --n-head was given: kept (check_config names it)
    assert note == (f"note: --init-from {tmp_path / 'hf'}: the model options not given follow "
                    f"its config.json: --vocab-size 300 --n-layer 3 --n-embd 8 "
                    f"--activation gelu_tanh")
    assert parse_args(["--config", _toml(tmp_path, "n_layer = 5\n")]).given == ["n_layer"]
    ns = parse_args(["--init-from", str(tmp_path / "hf"), "--model", "gpt"])
    ns.init_from = str(tmp_path / "nowhere")
    assert main.adopt_init_from_shape(ns) is None and ns.n_layer != 3


def _toml(tmp_path: Path, text: str) -> str:
    (tmp_path / "run.toml").write_text(text)
    return str(tmp_path / "run.toml")
