"""An ERNIE 2.0 model (task embeddings + its task heads) exports to Hugging Face's ERNIE and gives the same MLM logits
when Hugging Face gets our task ids as ``task_type_ids``."""
import pytest
import torch

from trainer.ernie.tasks import TASK_ID, TASKS
from trainer.models import flat_positions, get_preset
from trainer.models.hf_convert import export_hf
from trainer.objectives.ernie2 import Ernie2Objective

OPTIONS = {"continual": {"tasks": [
    {"name": "mlm", "iterations": 10, "level": "token"},
    {"name": "capitalization", "iterations": 10, "level": "token"},
    {"name": "sentence_reorder", "iterations": 10, "level": "sentence"}]}}


def test_ernie2_exports_to_hf_ernie_with_task_type_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = get_preset("tiny-ernie", extra_embeddings={"task": len(TASKS)}, dropout=0.0, attention_dropout=0.0)
    obj = Ernie2Objective(OPTIONS)
    model = obj.build_model(cfg).eval()
    with torch.no_grad():  # make the task table matter: random rows far from the init's small values
        model.encoder.embeddings.extra["task"].weight.normal_(0, 1.0)
    export_hf(cfg, model.state_dict(), tmp_path / "hf")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.use_task_id and hf.config.task_type_vocab_size == len(TASKS)

    B, T = 3, 12
    ids = torch.randint(5, cfg.vocab_size, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 9:] = 0
    task_ids = torch.full((B, T), TASK_ID["sentence_reorder"])
    task_ids[0] = TASK_ID["mlm"]
    positions = torch.arange(T).repeat(B, 1)
    flat, _ = flat_positions(positions, torch.where(mask.bool(), ids, -100), T)
    with torch.no_grad():
        ours = model(ids, mask, torch.zeros_like(ids), {"task": task_ids}, flat)["mlm"]
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                    task_type_ids=task_ids).logits[mask.bool()]
        other_task = model(ids, mask, torch.zeros_like(ids), {"task": torch.zeros_like(task_ids)}, flat)["mlm"]
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    assert not torch.allclose(ours, other_task, atol=1e-3)  # the task ids really reach the model
