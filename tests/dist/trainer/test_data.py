"""dist.trainer.data: token folders (nanoGPT, llm.c), text read whole and never cut, one-line
errors; and the main job stopping on an id outside the vocabulary found mid-run."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from autograd.data import DataError
from dist.trainer import data as data_mod
from dist.trainer.main import main as train_main

TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--eval-batches", "1", "--sample-tokens", "8", "--warmup", "2",
        "--progress", "plain"]
TEXT = "".join(f"line {i}: the quick brown fox {i % 7} jumps over {i % 13} lazy dogs\n"
               for i in range(400))


def _token_folder(path: Path, vocab: int = 500, n: int = 6000) -> Path:
    """A nanoGPT-style folder: headerless uint16 train.bin / val.bin, no meta."""
    path.mkdir(parents=True, exist_ok=True)
    ids = (np.cumsum(np.random.default_rng(0).integers(1, 4, n)) % vocab).astype(np.uint16)
    ids[: n * 9 // 10].tofile(path / "train.bin")
    ids[n * 9 // 10:].tofile(path / "val.bin")
    return path


def test_a_text_file_is_memory_mapped_and_never_truncated(tmp_path):
    f = tmp_path / "big.txt"
    f.write_bytes((TEXT.encode() * 200)[:3_000_000])
    corpus = data_mod.load_corpus(str(f), 64)
    assert len(corpus.train.tokens) + len(corpus.val.tokens) == 3_000_000  # was 2,000,000
    assert isinstance(corpus.train.tokens, np.memmap) and corpus.vocab_size == 256
    joined = np.concatenate([corpus.train.tokens, corpus.val.tokens])
    assert joined.tobytes() == f.read_bytes()
    cut = data_mod.load_corpus(str(f), 64, max_bytes=100_000)  # opt-in, and says so
    assert len(cut.train.tokens) + len(cut.val.tokens) == 100_000
    assert "its first 100,000 of 3,000,000 bytes (--max-bytes)" in cut.source


def test_a_text_folder_is_read_whole_in_order_with_separators(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("second " * 100)
    (tmp_path / "a.md").write_text("first " * 100)
    (tmp_path / "skip.bin").write_bytes(b"\0" * 10)
    corpus = data_mod.load_corpus(str(tmp_path), 16)
    joined = np.concatenate([corpus.train.tokens, corpus.val.tokens]).tobytes()
    assert joined == (b"first " * 100 + data_mod._SEPARATOR + b"second " * 100
                      + data_mod._SEPARATOR)


def _error_cases(tmp: Path) -> list[tuple[str, dict, str]]:
    (tmp / "empty.txt").write_bytes(b"")
    (tmp / "short.txt").write_text("x" * 40)
    (tmp / "blob.dat").write_bytes(b"abc\0def" * 100)
    np.arange(100, dtype=np.uint16).tofile(tmp / "loose.bin")
    _token_folder(tmp / "nometa")
    _token_folder(tmp / "noval")
    (tmp / "noval" / "val.bin").unlink()
    _token_folder(tmp / "meta")
    (tmp / "meta" / "meta.json").write_text(json.dumps({"vocab_size": 500, "dtype": "uint16"}))
    (tmp / "bins").mkdir()
    (tmp / "bins" / "shard_000.bin").write_bytes(b"\1\0" * 100)
    return [
        ("missing", {}, "--data: no such file or folder: "),
        ("empty.txt", {}, "empty.txt is empty"),
        ("short.txt", {"block_size": 16}, "is too small for --block-size 16: 36 train / 4 "
                                          "validation bytes, each split needs at least 18"),
        ("blob.dat", {}, "blob.dat is not text (NUL byte at offset 3)"),
        ("loose.bin", {}, "loose.bin looks like a token file (.bin), not text: pass the "
                          "folder that holds train.bin and val.bin"),
        ("nometa", {}, "has no meta.json (scripts/prepare_data.py writes one) and its token "
                       "files no llm.c header: give --vocab-size"),
        ("nometa", {"vocab_size": 100}, "train.bin: token id 499 at position 237 is outside "
                                        "the vocabulary [0, 100)"),
        ("nometa", {"vocab_size": 500, "token_dtype": "uint32"},  # pairs of uint16 ids
         "outside the vocabulary [0, 500) (wrong vocab size or token dtype?)"),
        ("noval", {"vocab_size": 500}, "has no val.bin"),
        ("meta", {"token_dtype": "uint32"}, "--token-dtype uint32 contradicts"),
        ("meta", {"max_bytes": 1000}, "--max-bytes applies to text data"),
        ("short.txt", {"token_dtype": "uint16"}, "--token-dtype applies to token folders"),
        ("bins", {}, "holds no text files (.c, .cfg"),
    ]


def test_data_that_cannot_be_trained_on_gives_one_line(tmp_path):
    for name, kwargs, message in _error_cases(tmp_path):
        kwargs = {"block_size": 64, **kwargs}
        with pytest.raises(DataError) as e:
            data_mod.load_corpus(str(tmp_path / name), kwargs.pop("block_size"), **kwargs)
        text = str(e.value)
        assert text.startswith("--data: ") and message in text and "\n" not in text, \
            (name, kwargs, text)


def test_token_folder_meta_and_nanogpt_meta_pkl(tmp_path):
    folder = _token_folder(tmp_path / "f", vocab=65)
    corpus = data_mod.load_corpus(str(folder), 16, vocab_size=65)
    assert corpus.unit == "tokens" and corpus.codec.kind == "ids"
    assert isinstance(corpus.train.tokens, np.memmap)
    chars = [chr(ord("A") + i) for i in range(65)]
    with open(folder / "meta.pkl", "wb") as f:  # as nanoGPT's shakespeare_char writes it
        pickle.dump({"vocab_size": 65, "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)
    corpus = data_mod.load_corpus(str(folder), 16)
    assert corpus.vocab_size == 65 and corpus.codec.kind == "chars"
    assert corpus.codec.decode(corpus.codec.encode("HELLO")) == "HELLO"

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": Exploit()}, f)
    with pytest.raises(DataError, match="not a nanoGPT meta.pkl of plain values "
                                        r"\(refusing posix.system\)"):
        data_mod.load_corpus(str(folder), 16)


@pytest.mark.parametrize("content,message", [
    (b"\x80\x02}]K\x01s.", r"\(TypeError: unhashable type: 'list'\)"),  # a list as a key
    (b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b"abc",  # BINBYTES8 of 1 TiB
     r"\(ValueError: expected 1099511627776 bytes in a bytes8, but only 3 remain\)"),
    (pickle.dumps({"vocab_size": "65"}), r"vocab_size must be an integer in \[1, 2\*\*31\)"),
    (pickle.dumps({"vocab_size": 65, "stoi": {"a": "x"}, "itos": {}}),
     "stoi and itos must map characters to ids"),
])
def test_a_malformed_meta_pkl_is_one_line(tmp_path, content, message):
    """Before: TypeError and MemoryError tracebacks (unhashable keys, length-bomb opcodes)."""
    folder = _token_folder(tmp_path / "f", vocab=65)
    (folder / "meta.pkl").write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        data_mod.load_corpus(str(folder), 16)
    assert "\n" not in str(info.value) and str(folder / "meta.pkl") in str(info.value)


def test_a_meta_pkl_with_only_vocab_size_samples_as_ids(tmp_path):
    """Valid for nanoGPT; before, the codec was "chars" and the final sample of a finished
    run died with KeyError: 'stoi'."""
    folder = _token_folder(tmp_path / "f", vocab=65)
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))
    corpus = data_mod.load_corpus(str(folder), 16)
    assert corpus.vocab_size == 65 and corpus.codec.kind == "ids"
    assert corpus.codec.decode([1, 2]) == "1 2"


@pytest.mark.parametrize("meta,message", [
    ({"vocab_size": [500]}, r"vocab_size must be an integer in \[1, 2\*\*31\), given \[500\]"),
    ({"vocab_size": 10**13}, "vocab_size must be an integer"),
    ({"dtype": "float64"}, "dtype must be 'uint16' or 'uint32', given 'float64'"),
    ({"dtype": {}}, "dtype must be 'uint16' or 'uint32'"),
    ({"tokenizer": "../../tok.json"}, "tokenizer must be the name of a file in the folder"),
    ({"tokenizer": 5}, "tokenizer must be the name of a file in the folder"),
    ({"encoding": ["bytes"]}, "encoding must be 'bytes' or 'tokenizer'"),
    ("[" * 100000 + "]" * 100000, r"not readable JSON \(nested too deeply\)"),
])
def test_malformed_meta_json_values_are_one_line(tmp_path, meta, message):
    """Before: TypeError tracebacks (int() of a list, a path joined with an int)."""
    folder = _token_folder(tmp_path / "f", vocab=500)
    (folder / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    with pytest.raises(DataError, match=message) as info:
        data_mod.load_corpus(str(folder), 16)
    assert "\n" not in str(info.value) and "meta.json" in str(info.value)


def test_llmc_token_files_in_a_folder(tmp_path):
    ids = (np.arange(3000) % 50257).astype(np.uint16)
    for split, part in (("train", ids[:2700]), ("val", ids[2700:])):
        header = np.zeros(256, dtype="<i4")
        header[:3] = 20240520, 1, len(part)
        with open(tmp_path / f"tiny_{split}.bin", "wb") as f:  # llm.c's file names
            header.tofile(f)
            part.tofile(f)
    corpus = data_mod.load_corpus(str(tmp_path), 32)
    assert corpus.vocab_size == 50257 and "llm.c gpt-2 uint16" in corpus.source
    np.testing.assert_array_equal(corpus.val.tokens, ids[2700:])


def test_an_id_outside_the_vocabulary_found_mid_run_stops_with_exit_2(tmp_path, capsys,
                                                                      monkeypatch):
    """Past FULL_CHECK_TOKENS the ids are checked per drawn batch: the run stops at the
    first batch that holds a bad id, with one line and exit 2 (in process: one rank)."""
    import autograd.data

    folder = _token_folder(tmp_path / "f")
    ids = np.fromfile(folder / "train.bin", dtype=np.uint16)
    ids[100::500] = 511
    ids.tofile(folder / "train.bin")
    monkeypatch.setattr(autograd.data, "FULL_CHECK_TOKENS", 10)
    code = train_main([*TINY, "--data", str(folder), "--vocab-size", "500", "--steps", "200",
                       "--eval-interval", "1000", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: --data: {folder / 'train.bin'}: token id 511 is "
                             f"outside the vocabulary [0, 500)"), err
