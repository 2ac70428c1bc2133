"""dist.trainer.prepare_data (scripts/prepare_data.py): text -> a token folder that
dist.trainer.data reads back as the text itself; one-line errors."""

from __future__ import annotations

import json

import numpy as np

from dist.trainer import data as data_mod
from dist.trainer import prepare_data
from tests.dist.trainer.test_data import TEXT


def test_prepare_data_bytes_round_trip(tmp_path):
    src = tmp_path / "notes.txt"
    src.write_text(TEXT + "\u00e9t\u00e9 \u2013 unicode\n")
    assert prepare_data.main([str(src), str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["vocab_size"] == 256 and meta["dtype"] == "uint16" and meta["tokenizer"] is None
    corpus = data_mod.load_corpus(str(tmp_path / "out"), 16)
    text_corpus = data_mod.load_corpus(str(src), 16)  # the same split as --data notes.txt
    for a, b in ((corpus.train, text_corpus.train), (corpus.val, text_corpus.val)):
        np.testing.assert_array_equal(a.tokens, b.tokens)
    assert corpus.codec.decode(np.concatenate([corpus.train.tokens, corpus.val.tokens])) == \
        src.read_text()
    assert not list((tmp_path / "out").glob(".*partial"))


def test_prepare_data_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "blob.dat").write_bytes(b"\0\1\2" * 10)
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "ok.txt").write_text(TEXT)
    cases = [([str(tmp_path / "blob.dat"), str(tmp_path / "o")], "is not text (NUL byte"),
             ([str(tmp_path / "nope"), str(tmp_path / "o")], "no such file or folder"),
             ([str(tmp_path / "ok.txt"), str(tmp_path / "o"), "--tokenizer", "/no/tok.json"],
              "--tokenizer: no such file: /no/tok.json"),
             ([str(tmp_path / "ok.txt"), str(tmp_path / "o"), "--val-fraction", "1"],
              "--val-fraction must lie in (0, 1), given 1.0")]
    if data_mod.tokenizers_available():
        cases.append(([str(tmp_path / "ok.txt"), str(tmp_path / "o"), "--tokenizer",
                       str(tmp_path / "bad.json")], "is not a tokenizer.json ("))
    for args, message in cases:
        assert prepare_data.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("prepare_data.py: error: ") and message in err, err
        assert err.count("\n") == 1, err
    assert not (tmp_path / "o" / "train.bin").exists()


def test_prepare_data_never_writes_through_a_planted_link(tmp_path, capsys):
    """Before: the fixed `.all.bin.partial`/`.val.bin.partial` names and meta.json were
    opened through links planted in OUT (the file outside overwritten)."""
    src, out, outside = tmp_path / "notes.txt", tmp_path / "out", tmp_path / "outside.txt"
    src.write_text(TEXT)
    out.mkdir()
    outside.write_text("keep")
    for name in (".all.bin.partial", ".val.bin.partial", ".meta.json.tmp"):
        (out / name).symlink_to(outside)
    assert prepare_data.main([str(src), str(out)]) == 0
    assert outside.read_text() == "keep"
    assert len(data_mod.load_corpus(str(out), 16).train.tokens) > 0
    (out / "meta.json").unlink()
    (out / "meta.json").symlink_to(outside)
    assert prepare_data.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_data.py: error: ") and "meta.json: resolves to" in err
    assert err.count("\n") == 1 and outside.read_text() == "keep"


def test_files_left_out_of_a_folder_are_named(tmp_path, capsys):
    """Before: 13 text files with other suffixes were skipped without a word."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text(TEXT)
    for name in ("notes.log", "sub/data.csv", "README", "x.yaml"):
        (src / name).write_text(TEXT)
    assert prepare_data.main([str(src), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"from {src}, 1 text files (4 others skipped, not a text suffix .c .cfg" in out
    assert "README, notes.log, x.yaml, ...)" in out
    corpus = data_mod.load_corpus(str(src), 16)
    assert "(4 others skipped" in corpus.source
