"""dist.trainer.export (scripts/export.py): a missing --out folder is created; a target
that links out of its folder is refused with one line and nothing is written."""

from __future__ import annotations

import autograd as ag
from dist.trainer import export
from tests.dist.trainer.test_generate import _checkpoint


def test_out_into_a_missing_folder_is_created(tmp_path, capsys):
    """Before: a raw safetensors traceback (no such file or directory)."""
    _checkpoint(tmp_path / "ck")
    out = tmp_path / "new" / "sub" / "model.safetensors"
    assert export.main(["--checkpoint", str(tmp_path / "ck"), "--out", str(out),
                        "--gpt2", str(tmp_path / "new" / "gpt2")]) == 0
    assert "wte.weight" in ag.load(out) and (tmp_path / "new" / "gpt2" / "config.json").exists()


def test_a_target_linked_outside_is_refused_before_anything_is_written(tmp_path, capsys):
    _checkpoint(tmp_path / "ck")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").symlink_to(outside)
    out = tmp_path / "out" / "model.safetensors"
    assert export.main(["--checkpoint", str(tmp_path / "ck"), "--out", str(out),
                        "--gpt2", str(tmp_path / "gpt2")]) == 2
    err = capsys.readouterr().err
    assert err == (f"export.py: error: {tmp_path / 'gpt2' / 'config.json'}: resolves to "
                   f"{outside}, outside {tmp_path / 'gpt2'} (a link out of the folder); "
                   f"refused, nothing written\n")
    assert outside.read_text() == "keep" and not out.exists()
    assert [p.name for p in (tmp_path / "gpt2").iterdir()] == ["config.json"]
