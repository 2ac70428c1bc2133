"""scripts/prepare_data.py, train.py and generate.py on token folders: a tokenizer.json's
folder trained and sampled, a nanoGPT-style folder under mpiexec like one process, and data
errors as one line and exit 2 on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dist.trainer import data as data_mod
from dist.trainer import prepare_data
from tests.dist.trainer.test_data import TEXT, _error_cases, _token_folder
from tests.scripts.test_train import _errors, run_here, run_many

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--eval-batches", "1", "--sample-tokens", "8", "--warmup", "2",
        "--progress", "plain"]


def test_prepare_data_with_a_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text(TEXT)
    (tmp_path / "src" / "b.txt").write_text(TEXT[:500])
    assert prepare_data.main([str(tmp_path / "src"), str(tmp_path / "out"), "--tokenizer",
                              str(tmp_path / "tok.json"), "--val-fraction", "0.2"]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["vocab_size"] == tok.get_vocab_size() and meta["tokenizer"] == "tokenizer.json"
    corpus = data_mod.load_corpus(str(tmp_path / "out"), 16)
    assert corpus.codec.kind == "tokenizer" and corpus.vocab_size == meta["vocab_size"]
    ids = np.concatenate([corpus.train.tokens, corpus.val.tokens])
    assert len(ids) < len(TEXT) and len(corpus.val.tokens) == int(len(ids) * 0.2)
    sep = data_mod._SEPARATOR.decode()
    assert corpus.codec.decode(ids) == TEXT + sep + TEXT[:500] + sep
    # train.py takes vocabulary and dtype from meta.json; generate.py decodes with the
    # tokenizer the checkpoint's data named.
    res = run_here(*TINY, "--data", str(tmp_path / "out"), "--steps", "2",
                   "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"vocabulary {meta['vocab_size']} (" in res.stdout
    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                          "--checkpoint", str(tmp_path / "run" / "checkpoint"), "--prompt",
                          "the quick brown", "--tokens", "4"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert gen.returncode == 0 and gen.stdout.startswith("the quick brown"), gen.stderr


def test_a_token_folder_trains_under_mpiexec_like_one_process(tmp_path):
    """A nanoGPT-style folder (headerless uint16, --vocab-size) under mpiexec -n 2 (dp 2)
    and -n 4 (dp 2 x pp 2): the same global batches, so the single process's losses."""
    folder = _token_folder(tmp_path / "owt")
    base = [*TINY, "--data", str(folder), "--vocab-size", "512", "--steps", "4",
            "--eval-interval", "2", "--out"]
    runs = [run_here(*base, str(tmp_path / "n1")),
            *run_many([(2, [*base, str(tmp_path / "n2"), "--dp", "2"]),
                       (4, [*base, str(tmp_path / "n4"), "--dp", "2", "--pp", "2"])])]
    for res in runs:
        assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    assert "nanogpt uint16 ids, vocabulary 512 (5,400 train / 600 val tokens)" in \
        runs[0].stdout
    hist = [json.loads((tmp_path / d / "metrics.json").read_text())["history"]
            for d in ("n1", "n2", "n4")]
    assert [h["step"] for h in hist[0]] == [1, 2, 4]
    for other in hist[1:]:
        for a, b in zip(hist[0], other, strict=True):
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)
    assert hist[0][-1]["train_loss"] < hist[0][0]["train_loss"]
    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                          "--checkpoint", str(tmp_path / "n4" / "checkpoint"), "--prompt",
                          "7 8 9", "--tokens", "5"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert gen.returncode == 0, gen.stderr
    ids = [int(t) for t in gen.stdout.split()]  # no tokenizer: ids in, ids out
    assert ids[:3] == [7, 8, 9] and len(ids) == 8 and max(ids) < 512


def test_data_errors_exit_2_on_every_rank_with_one_line(tmp_path):
    cases = [(name, kwargs, message) for name, kwargs, message in _error_cases(tmp_path)
             if name in ("blob.dat", "short.txt") and not kwargs.get("token_dtype")]
    cases.append(("nometa", {"vocab_size": 100}, "token id 499 at position 237"))
    jobs = [(2, [*TINY, "--steps", "2", "--data", str(tmp_path / name),
                 *(["--vocab-size", "100"] if kwargs.get("vocab_size") else []),
                 "--out", str(tmp_path / f"run{i}")])
            for i, (name, kwargs, _) in enumerate(cases)]
    for (name, _, message), res in zip(cases, run_many(jobs), strict=True):
        assert res.returncode == 2, (name, res.stderr[-3000:])
        errors = _errors(res)
        assert len(errors) == 1 and errors[0].startswith("train.py: error: --data: "), \
            res.stderr[-3000:]
        assert message in errors[0] and "Traceback" not in res.stderr, (name, errors)
