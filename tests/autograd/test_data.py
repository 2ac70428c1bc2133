"""autograd.data: token files (nanoGPT, llm.c), TokenDataset and the dp-sharded DataLoader."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import data


def _ids(n: int, high: int = 300, seed: int = 0, dtype=np.uint16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, n).astype(dtype)


def _llmc(path, ids: np.ndarray, magic: int = 20240520, version: int = 1, count=None):
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(ids) if count is None else count
    with open(path, "wb") as f:
        header.tofile(f)
        ids.tofile(f)


def test_nanogpt_file_is_memory_mapped_and_windows_match_slices(tmp_path):
    ids = _ids(1000)
    ids.tofile(tmp_path / "train.bin")
    ds = data.TokenDataset(tmp_path / "train.bin", block_size=8, vocab_size=300)
    assert isinstance(ds.tokens, np.memmap) and ds.info["format"] == "nanogpt"
    assert len(ds) == 1000 - 8 - 1 and ds.fully_checked
    x, y = ds.windows(np.array([0, 5, len(ds)]))
    assert x.dtype == np.int64 and x.shape == (3, 8)
    for row, s in enumerate([0, 5, len(ds)]):
        np.testing.assert_array_equal(x[row], ids[s:s + 8])
        np.testing.assert_array_equal(y[row], ids[s + 1:s + 9])
    with pytest.raises(IndexError, match=r"window starts must lie in \[0, 991\]"):
        ds.windows(np.array([992]))


def test_uint32_and_llmc_headers_are_honoured(tmp_path):
    ids = _ids(500, high=100_000, dtype=np.uint32)
    ids.tofile(tmp_path / "raw32.bin")
    ds = data.TokenDataset(tmp_path / "raw32.bin", 4, dtype="uint32", vocab_size=100_000)
    np.testing.assert_array_equal(ds.tokens, ids)
    _llmc(tmp_path / "gpt2.bin", ids[:300].astype(np.uint16) % 50257)
    tokens, info = data.read_token_file(tmp_path / "gpt2.bin")
    assert info == {"format": "llm.c gpt-2", "dtype": "uint16", "vocab_size": 50257}
    np.testing.assert_array_equal(tokens, ids[:300].astype(np.uint16) % 50257)
    _llmc(tmp_path / "llama.bin", ids, magic=20240801, version=7)
    tokens, info = data.read_token_file(tmp_path / "llama.bin")
    assert info["format"] == "llm.c llama-3" and tokens.dtype == np.uint32
    np.testing.assert_array_equal(tokens, ids)
    with pytest.raises(data.DataError, match="says uint32 tokens, given dtype uint16"):
        data.read_token_file(tmp_path / "llama.bin", "uint16")
    _llmc(tmp_path / "short.bin", ids[:10].astype(np.uint16), count=11)
    with pytest.raises(data.DataError, match="11 tokens does not match the file"):
        data.read_token_file(tmp_path / "short.bin")


@pytest.mark.parametrize("content,dtype,message", [
    (b"", None, "empty token file"),
    (b"\x01\x00\x02", None, "3 bytes is not a whole number of uint16 tokens"),
    (b"\x01\x00\x02\x00\x03\x00", "uint32", "6 bytes is not a whole number of uint32"),
    (b"\x01\x00", "int8", "token dtype must be uint16 or uint32, given int8"),
    # an llm.c file cut inside its header: was read as 258 headerless ids
    (np.array([20240520, 1, 5000], "<i4").tobytes() + bytes(504), None,
     "starts with llm.c's magic 20240520 but is 516 bytes, cut inside its 1024-byte header"),
])
def test_bad_token_files_give_one_line(tmp_path, content, dtype, message):
    (tmp_path / "t.bin").write_bytes(content)
    with pytest.raises(data.DataError, match=message) as e:
        data.read_token_file(tmp_path / "t.bin", dtype)
    assert "\n" not in str(e.value)


def test_ids_outside_the_vocabulary_are_found_at_start_or_per_batch(tmp_path, monkeypatch):
    ids = _ids(2000, high=256)
    ids[1234] = 300
    with pytest.raises(data.DataError, match=r"token id 300 at position 1,234 is outside "
                                             r"the vocabulary \[0, 256\)"):
        data.TokenDataset(ids, 8, vocab_size=256)
    # Past FULL_CHECK_TOKENS only the drawn batches are checked: the whole global batch, on
    # every rank, so that ranks whose own rows are clean stop too.
    monkeypatch.setattr(data, "FULL_CHECK_TOKENS", 100)
    ds = data.TokenDataset(ids, 8, vocab_size=256)
    assert not ds.fully_checked
    loaders = [data.DataLoader(ds, 64, seed=1, rank=r, world_size=4) for r in range(4)]
    bad_step = next(s for s in range(1000)
                    if (np.abs(loaders[0].starts(s) + 4 - 1234) <= 4).any())
    for loader in loaders:
        for s in range(bad_step):
            loader.batch(s)
        with pytest.raises(data.DataError, match="token id 300 is outside"):
            loader.batch(bad_step)
    assert data.TokenDataset(ids.astype(np.uint8), 8, vocab_size=256).fully_checked


def test_short_data_and_bad_arguments():
    with pytest.raises(data.DataError, match="array: 9 tokens is too short for block_size 8"):
        data.TokenDataset(np.arange(9), 8)
    with pytest.raises(TypeError, match="expected a 1-D integer array, given float32"):
        data.TokenDataset(np.zeros(20, np.float32), 8)
    ds = data.TokenDataset(np.arange(100), 8)
    with pytest.raises(ValueError, match="batch_size must be a positive multiple of "
                                         "world_size 3, given 8"):
        data.DataLoader(ds, 8, world_size=3)
    with pytest.raises(ValueError, match=r"rank must lie in \[0, world_size=2\), given 2"):
        data.DataLoader(ds, 8, rank=2, world_size=2)


def test_rank_batches_union_is_the_global_batch_keyed_by_seed_and_step():
    ds = data.TokenDataset(_ids(5000), 16)
    whole = data.DataLoader(ds, 8, seed=3)
    x8, y8 = whole.global_batch(7)
    for world in (1, 2, 4, 8):
        parts = [data.DataLoader(ds, 8, seed=3, rank=r, world_size=world).batch(7)
                 for r in range(world)]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x8)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y8)
    # The same draw the main job always made: default_rng([seed, step]).
    starts = np.random.default_rng([3, 7]).integers(0, 5000 - 16 - 1, size=8)
    np.testing.assert_array_equal(whole.starts(7), starts)
    assert not np.array_equal(whole.starts(8), starts)
    assert not np.array_equal(data.DataLoader(ds, 8, seed=4).starts(7), starts)


def test_iteration_yields_tensors_from_start_for_steps():
    ds = data.TokenDataset(_ids(500), 8)
    loader = data.DataLoader(ds, 4, seed=0, rank=1, world_size=2, start=5, steps=3)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3
    for i, (x, y) in enumerate(batches):
        assert isinstance(x, ag.Tensor) and x.shape == (2, 8) and x.dtype == np.int64
        np.testing.assert_array_equal(x.numpy(), loader.batch(5 + i)[0])
        np.testing.assert_array_equal(y.numpy(), loader.batch(5 + i)[1])


@pytest.mark.mpi
def test_ranks_of_a_mesh_draw_the_single_process_global_batch():
    import dist

    world = dist.init()
    if 8 % world.size:
        pytest.skip("batch of 8 must split evenly")
    ds = data.TokenDataset(_ids(3000), 16, vocab_size=300)
    mesh = dist.ProcessMesh(dp=world.size, world=world)
    by_mesh = data.DataLoader(ds, 8, seed=11, mesh=mesh, start=2, steps=2)
    got = [(x.numpy(), y.numpy()) for x, y in by_mesh]
    gathered = world.all_gather_object(got)
    single = data.DataLoader(ds, 8, seed=11)
    for i, step in enumerate((2, 3)):
        x, y = single.global_batch(step)
        np.testing.assert_array_equal(np.concatenate([g[i][0] for g in gathered]), x)
        np.testing.assert_array_equal(np.concatenate([g[i][1] for g in gathered]), y)


def test_an_in_memory_source_is_kept_on_the_host():
    """A host array (a memmap included) is used as it is; a device array is copied to the
    host (on a GPU NumPy cannot read a CuPy array implicitly)."""
    tokens = np.arange(64, dtype=np.int64) % 7
    assert data.TokenDataset(tokens, block_size=8, vocab_size=7).tokens is tokens
    dev = data.TokenDataset(gp.to_device(tokens, "emulated"), block_size=8,
                            vocab_size=7).tokens
    assert type(dev) is np.ndarray and np.array_equal(dev, tokens)
