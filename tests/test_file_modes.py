"""Exported weights are readable as the umask says: safetensors writes 0600 whatever the umask, so a model exported
into a shared project folder could be read by its writer alone (review, 2026-12-06: every model.safetensors of
export_hf, our model folders and fine-tuned exports came out 0600)."""
from __future__ import annotations

import os
import stat

import pytest

from trainer.models import MLM, NSP, HeadSpec, PretrainingModel, get_preset


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask,want", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_exported_weights_take_the_umask(tmp_path, umask, mask, want):
    from trainer.models.hf_convert import export_hf
    from trainer.models.model_folder import save_model_folder

    umask(mask)
    cfg = get_preset("tiny")
    model = PretrainingModel(cfg, {MLM: HeadSpec("mlm"), NSP: HeadSpec("sequence", 2)})
    export_hf(cfg, model.state_dict(), tmp_path / "hf")
    save_model_folder(model, cfg, tmp_path / "ours")
    files = [tmp_path / "hf" / "model.safetensors", tmp_path / "ours" / "model.safetensors",
             tmp_path / "hf" / "config.json"]
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in files} == {str(p): want for p in files}
