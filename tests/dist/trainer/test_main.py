"""dist.trainer.main's up-front checks: a model the options cannot build or a rank cannot
hold is one error line before anything is allocated; run metadata is checked on resume."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dist.trainer import main


def _ns(**options) -> argparse.Namespace:
    base = dict(n_layer=1, n_head=1, n_embd=16, block_size=16, dropout=0.0, attn_dropout=None,
                seed=0, activation="gelu", tp=1, pp=1, device="cpu")
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
