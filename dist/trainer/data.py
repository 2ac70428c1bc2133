"""Training data for the main job: a token folder (nanoGPT / llm.c layout), or the bytes of
a text file, a folder, or (by default) the Python standard library's own sources.

* Token folder: `train.bin` and `val.bin` (or one `*train*.bin` and one `*val*.bin`, as
  llm.c names them) of flat token ids, memory-mapped, never read whole. nanoGPT's files
  are headerless (dtype from --token-dtype, else meta.json, else uint16); llm.c's start
  with a 256-int32 header (magic 20240520 / 20240801) whose dtype and token count are
  honoured. The vocabulary comes from --vocab-size, else the folder's meta.json (written by
  scripts/prepare_data.py), else nanoGPT's meta.pkl, else the llm.c header's tokenizer
  (GPT-2: 50257, Llama 3: 128256); ids outside it stop the run with one line.
* Text: token = byte value (vocabulary 256), so it needs no tokenizer and round-trips any
  text. A file is memory-mapped; a folder's text files (sorted by relative path, joined
  with a separator line) are read whole; nothing is cut unless --max-bytes asks. The last
  `val_fraction` of the bytes is the validation split. A file that is not text (NUL bytes,
  or a .bin outside a token folder) or too short for the context is refused in one line.

Batches come from autograd.data.DataLoader (keyed by (seed, step), split over dp ranks).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autograd.data import DataError, TokenDataset, read_token_file

VOCAB_SIZE = 256
_SEPARATOR = b"\n# ----\n"
_TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".c", ".h", ".json", ".toml", ".cfg", ".ini"}
_SNIFF_BYTES = 1 << 20  # a text file's first MiB is checked for NUL bytes


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(tokens: np.ndarray | list[int]) -> str:
    return bytes(int(t) & 0xFF for t in tokens).decode("utf-8", errors="replace")


class Codec:
    """Text <-> ids for prompts and samples: "bytes"; "tokenizer" (a Hugging Face
    tokenizer.json, `path`); "chars" (nanoGPT's meta.pkl itos/stoi, `path`); "ids" (no
    tokenizer known: prompts and samples are token ids separated by spaces)."""

    def __init__(self, kind: str = "bytes", path: str | None = None) -> None:
        if kind not in ("bytes", "tokenizer", "chars", "ids"):
            raise ValueError(f"unknown codec kind {kind!r}")
        self.kind, self.path = kind, path
        self._impl = None

    @property
    def spec(self) -> dict:
        return {"kind": self.kind, "path": self.path}

    @classmethod
    def from_spec(cls, spec: dict | None) -> Codec:
        """The codec `spec` (a checkpoint's args["codec"]) describes; ValueError if it is
        not one."""
        if not spec:
            return cls()
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) \
                or not isinstance(spec.get("path"), (str, type(None))):
            raise ValueError(f"the data's codec must be {{'kind': name, 'path': file or "
                             f"null}}, given {str(spec)[:60]}")
        return cls(spec["kind"], spec.get("path"))

    def describe(self) -> str:
        return self.kind if self.path is None else f"{self.kind} {self.path}"

    def _load(self):
        if self._impl is None:
            if self.path is not None and not Path(self.path).is_file():
                raise ValueError(f"the data's {self.kind} file {self.path} is gone (moved?)")
            if self.kind == "tokenizer":
                from tokenizers import Tokenizer

                self._impl = Tokenizer.from_file(self.path)
            elif self.kind == "chars":
                self._impl = _read_pickle_meta(Path(self.path))
        return self._impl

    def encode(self, text: str) -> np.ndarray:
        """int64 ids of `text`; ValueError when this codec cannot encode it."""
        impl = self._load()
        if self.kind == "bytes":
            ids = list(encode(text))
        elif self.kind == "tokenizer":
            ids = impl.encode(text).ids
        elif self.kind == "chars":
            missing = sorted({c for c in text if c not in impl["stoi"]})
            if missing:
                raise ValueError(f"characters {missing} are not in {self.path}'s vocabulary")
            ids = [impl["stoi"][c] for c in text]
        else:
            try:
                ids = [int(t) for t in text.split()]
            except ValueError:
                raise ValueError("the data has no tokenizer: give the prompt as token ids "
                                 "separated by spaces") from None
        if not ids:
            raise ValueError(f"{text!r} encodes to no tokens")
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        impl = self._load()
        ids = [int(t) for t in ids]
        if self.kind == "bytes":
            return decode(ids)
        if self.kind == "tokenizer":
            return impl.decode(ids, skip_special_tokens=False)
        if self.kind == "chars":
            return "".join(impl["itos"].get(i, "\ufffd") for i in ids)
        return " ".join(str(i) for i in ids)


def tokenizers_available() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Corpus:
    train: TokenDataset
    val: TokenDataset
    source: str
    vocab_size: int
    unit: str = "bytes"  # or "tokens"
    codec: Codec = field(default_factory=Codec)

    def prompt(self, text: str = "def ") -> np.ndarray:
        """Ids of `text` for a sample, or the validation split's first id when the codec
        cannot encode it."""
        try:
            return self.codec.encode(text)
        except (ValueError, ImportError, KeyError, OSError):
            return np.asarray(self.val.tokens[:1], dtype=np.int64)


def _files_under(root: Path) -> tuple[list[Path], list[Path]]:
    """(the text files under `root` by relative path, the other files left out)."""
    files, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in {"__pycache__", "site-packages",
                                                               "dist-packages", ".git"})
        for f in sorted(filenames):
            p = Path(dirpath) / f
            (files if p.suffix in _TEXT_SUFFIXES else skipped).append(p)
    return sorted(files, key=lambda p: str(p.relative_to(root))), skipped


def text_files(path: str | None) -> tuple[list[Path], str]:
    """(the text files `path` stands for, in order; a description): the file itself, a
    folder's text files (the description says how many others were left out, and why), or
    the stdlib's .py files for None."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        return [p for p in _files_under(root)[0] if p.suffix == ".py"], \
            f"python stdlib sources ({root})"
    root = Path(path)
    if not root.exists():
        raise DataError(f"no such file or folder: {path}")
    if root.is_file():
        check_text_file(root)
        return [root], str(root)
    files, skipped = _files_under(root)
    if not files:
        bins = sorted(p.name for p in root.glob("*.bin"))
        hint = (f"; it has {', '.join(bins[:3])}: a token folder needs train.bin and val.bin"
                if bins else "")
        raise DataError(f"{path} holds no text files ({', '.join(sorted(_TEXT_SUFFIXES))})"
                        f"{hint}")
    description = f"{root}, {len(files)} text files"
    if skipped:
        names = ", ".join(str(p.relative_to(root)) for p in skipped[:3])
        description += (f" ({len(skipped)} others skipped, not a text suffix "
                        f"{' '.join(sorted(_TEXT_SUFFIXES))}: {names}"
                        f"{', ...' if len(skipped) > 3 else ''})")
    return files, description


def check_text_file(path: Path) -> None:
    """DataError when `path` is empty or does not look like text."""
    if path.suffix == ".bin":
        raise DataError(f"{path} looks like a token file (.bin), not text: pass the folder "
                        f"that holds train.bin and val.bin (nanoGPT/llm.c layout)")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty")
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if b"\0" in head:
        raise DataError(f"{path} is not text (NUL byte at offset {head.index(0)}); token "
                        f"ids go in a folder with train.bin and val.bin")


def token_files(folder: Path) -> tuple[Path, Path] | None:
    """(train, val) token files of a token folder, or None when `folder` is not one."""
    if not folder.is_dir():
        return None
    if (folder / "train.bin").is_file() or (folder / "val.bin").is_file():
        train, val = folder / "train.bin", folder / "val.bin"
    else:
        trains, vals = sorted(folder.glob("*train*.bin")), sorted(folder.glob("*val*.bin"))
        if not trains and not vals:
            return None
        if len(trains) > 1 or len(vals) > 1:
            raise DataError(f"{folder} holds {len(trains)} train and {len(vals)} val token "
                            f"files; one of each is supported (concatenate the shards)")
        train = trains[0] if trains else folder / "train.bin"
        val = vals[0] if vals else folder / "val.bin"
    for p in (train, val):
        if not p.is_file():
            raise DataError(f"token folder {folder} has no {p.name}")
    return train, val


def read_meta(folder: Path) -> dict:
    """The folder's meta.json (scripts/prepare_data.py), else what nanoGPT's meta.pkl says
    (vocab_size; "chars" when it has stoi/itos to encode and decode with), else {}. Every
    value is checked: DataError naming the file and field."""
    path = folder / "meta.json"
    if path.is_file():
        if path.stat().st_size > _MAX_META_BYTES:
            raise DataError(f"{path}: {path.stat().st_size} bytes, expected at most "
                            f"{_MAX_META_BYTES}")
        try:
            meta = json.loads(path.read_bytes())
        except (ValueError, OSError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise DataError(f"{path}: not readable JSON ({why})") from None
        if not isinstance(meta, dict):
            raise DataError(f"{path}: expected a JSON object, given {type(meta).__name__}")
        _check_meta(path, meta)
        return meta
    if (folder / "meta.pkl").is_file():
        meta = _read_pickle_meta(folder / "meta.pkl")
        return {"vocab_size": meta.get("vocab_size"), "meta_pkl": True,
                "chars": "stoi" in meta and "itos" in meta}
    return {}


def _check_meta(path: Path, meta: dict) -> None:
    """meta.json's fields (all optional) as prepare_data.py writes them, or DataError."""
    def fail(field: str, expected: str) -> DataError:
        text = repr(meta[field])
        text = text if len(text) <= 60 else text[:57] + "..."
        return DataError(f"{path}: {field} must be {expected}, given {text}")

    vocab = meta.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int)
                              or not 0 < vocab < 2**31):
        raise fail("vocab_size", "an integer in [1, 2**31)")
    if meta.get("dtype") not in (None, "uint16", "uint32"):
        raise fail("dtype", "'uint16' or 'uint32'")
    if meta.get("encoding") not in (None, "bytes", "tokenizer"):
        raise fail("encoding", "'bytes' or 'tokenizer'")
    name = meta.get("tokenizer")
    if name is not None and (not isinstance(name, str) or Path(name).name != name
                             or name in ("", ".", "..")):
        raise fail("tokenizer", "the name of a file in the folder (tokenizer.json)")


_MAX_META_BYTES = 16 << 20  # meta.json / meta.pkl: a vocabulary at most


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # only plain containers: nothing runs
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _read_pickle_meta(path: Path) -> dict:
    """nanoGPT's meta.pkl: a dict of plain values (vocab_size, and stoi/itos when it has
    them), its size bounded; DataError (one line) for anything else."""
    try:
        if path.stat().st_size > _MAX_META_BYTES:
            raise DataError(f"{path}: {path.stat().st_size} bytes, expected a nanoGPT "
                            f"meta.pkl of at most {_MAX_META_BYTES}")
        data = path.read_bytes()
        for _ in pickletools.genops(data):  # every length within the file: no length bomb
            pass
        meta = _PlainUnpickler(io.BytesIO(data)).load()
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - nothing runs (find_class); any failure: one line
        text = str(exc).strip().splitlines()[0][:80] if str(exc).strip() else ""
        if not isinstance(exc, pickle.UnpicklingError) or not text:
            text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        raise DataError(f"{path}: not a nanoGPT meta.pkl of plain values ({text})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not a nanoGPT meta.pkl (a {type(meta).__name__})")
    vocab = meta.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int)
                              or not 0 < vocab < 2**31):
        raise DataError(f"{path}: vocab_size must be an integer in [1, 2**31), given "
                        f"{str(vocab)[:40]}")
    stoi, itos = meta.get("stoi"), meta.get("itos")
    if (stoi is not None or itos is not None) and not (
            isinstance(stoi, dict) and isinstance(itos, dict)
            and all(isinstance(k, str) and isinstance(v, int) for k, v in stoi.items())
            and all(isinstance(k, int) and isinstance(v, str) for k, v in itos.items())):
        raise DataError(f"{path}: stoi and itos must map characters to ids and ids to "
                        f"characters")
    return meta


def load_corpus(path: str | None = None, block_size: int = 64, *,
                vocab_size: int | None = None, token_dtype: str | None = None,
                max_bytes: int | None = None, val_fraction: float = 0.1) -> Corpus:
    """The train and validation TokenDatasets of --data `path`; DataError (one line
    starting "--data:") when they cannot be trained on."""
    try:
        folder = None if path is None else token_files(Path(path))
        if folder is not None:
            if max_bytes is not None:
                raise DataError("--max-bytes applies to text data; a token folder is "
                                "memory-mapped whole")
            return _token_corpus(Path(path), *folder, block_size, vocab_size, token_dtype)
        if token_dtype is not None:
            raise DataError(f"--token-dtype applies to token folders (train.bin and "
                            f"val.bin); {path or 'the default corpus'} is text")
        return _text_corpus(path, block_size, vocab_size, max_bytes, val_fraction)
    except DataError as exc:
        raise DataError(f"--data: {exc}") from None


def _token_corpus(folder: Path, train: Path, val: Path, block_size: int,
                  vocab_size: int | None, token_dtype: str | None) -> Corpus:
    meta = read_meta(folder)
    if token_dtype and meta.get("dtype") and token_dtype != meta["dtype"]:
        raise DataError(f"--token-dtype {token_dtype} contradicts {folder / 'meta.json'} "
                        f"(dtype {meta['dtype']})")
    dtype = token_dtype or meta.get("dtype")
    _, info = read_token_file(train, dtype)
    vocab = vocab_size or meta.get("vocab_size") or info["vocab_size"]
    if vocab is None:
        raise DataError(f"{folder} has no meta.json (scripts/prepare_data.py writes one) and "
                        f"its token files no llm.c header: give --vocab-size (the "
                        f"tokenizer's vocabulary, e.g. 50257 for GPT-2)")
    sets = [TokenDataset(p, block_size, vocab_size=int(vocab), dtype=dtype) for p in (train, val)]
    if sets[1].info["format"] != info["format"]:
        raise DataError(f"{train.name} is {info['format']} but {val.name} is "
                        f"{sets[1].info['format']}")
    codec = Codec("ids")
    if meta.get("tokenizer") and tokenizers_available():
        codec = Codec("tokenizer", str((folder / meta["tokenizer"]).resolve()))
    elif meta.get("chars"):  # (a meta.pkl with only vocab_size: samples as ids)
        codec = Codec("chars", str((folder / "meta.pkl").resolve()))
    elif meta.get("encoding") == "bytes":
        codec = Codec("bytes")
    source = f"{folder}, {info['format']} {info['dtype']} ids, vocabulary {vocab}"
    if meta.get("tokenizer") and codec.kind == "ids":
        source += " (samples as ids: the tokenizers package is not installed)"
    return Corpus(sets[0], sets[1], source, int(vocab), "tokens", codec)


def _text_corpus(path: str | None, block_size: int, vocab_size: int | None,
                 max_bytes: int | None, val_fraction: float) -> Corpus:
    files, source = text_files(path)
    if path is not None and Path(path).is_file():
        tokens = np.memmap(files[0], dtype=np.uint8, mode="r")
    else:
        chunks = []
        for f in files:
            try:
                chunks.append(f.read_bytes() + _SEPARATOR)
            except OSError:  # unreadable files in a folder (permissions): left out
                continue
        tokens = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if len(tokens) == 0:
        raise DataError(f"{source} is empty")
    if max_bytes is not None and len(tokens) > max_bytes:
        source += f", its first {max_bytes:,} of {len(tokens):,} bytes (--max-bytes)"
        tokens = tokens[:max_bytes]
    n_val = max(int(len(tokens) * val_fraction), 1)
    need = block_size + 2
    if min(len(tokens) - n_val, n_val) < need:
        raise DataError(f"{source} is too small for --block-size {block_size}: "
                        f"{len(tokens) - n_val:,} train / {n_val:,} validation bytes, each "
                        f"split needs at least {need}")
    vocab = vocab_size or VOCAB_SIZE
    train, val = (TokenDataset(t, block_size, vocab_size=vocab, name=f"{source}")
                  for t in (tokens[:-n_val], tokens[-n_val:]))
    return Corpus(train, val, source, vocab, "bytes", Codec("bytes"))
