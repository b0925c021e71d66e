"""The task heads are Hugging Face's: a fine-tuned span, token, choice (and sequence) model of each family exports
to a folder that ``transformers``' own *ForQuestionAnswering / *ForTokenClassification / *ForMultipleChoice /
*ForSequenceClassification class loads with the same logits; the heads start from the checkpoint's encoder (and
pooler where Hugging Face keeps it). Tiny models with perturbed weights (no training): fast."""
from __future__ import annotations

import pytest
import torch

from trainer.finetune.heads import TaskModel, build_task_model, export_finetuned
from trainer.finetune.model import Classifier, Source
from trainer.models import get_preset

PRESETS = {"bert": "tiny", "roberta": "tiny-roberta", "albert": "tiny-albert", "electra": "tiny-electra",
           "ernie": "tiny-ernie"}


def config(family: str):
    pad = 1 if family == "roberta" else 0
    return get_preset(PRESETS[family], vocab_size=120, pad_token_id=pad, dropout=0.0, attention_dropout=0.0,
                      **({"position_offset": pad + 1} if family == "roberta" else {}))


def perturbed(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def inputs(cfg, shape):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.vocab_size, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[..., -3:] = 0
    mask[0, ..., :] = 1
    ids[mask == 0] = cfg.pad_token_id
    types = torch.zeros_like(ids)
    types[..., 4:] = 1 if cfg.type_vocab_size > 1 else 0
    return ids, mask, types


@pytest.mark.parametrize("head", ["span", "token", "choice", "sequence"])
@pytest.mark.parametrize("family", sorted(PRESETS))
def test_export_loads_in_transformers_with_equal_logits(family, head, tmp_path):
    import transformers
    cfg = config(family)
    torch.manual_seed(0)
    model = perturbed(Classifier(cfg, 3) if head == "sequence" else TaskModel(cfg, head, 5))
    arch = export_finetuned(model, tmp_path / "hf", labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
                            if head == "token" else None)
    auto = {"span": "AutoModelForQuestionAnswering", "token": "AutoModelForTokenClassification",
            "choice": "AutoModelForMultipleChoice", "sequence": "AutoModelForSequenceClassification"}[head]
    hf = getattr(transformers, auto).from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    assert type(hf).__name__ == arch
    ids, mask, types = inputs(cfg, (2, 4, 10) if head == "choice" else (2, 10))
    with torch.no_grad():
        ours = model(ids, mask, types)
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if head == "span":
        theirs = torch.stack([out.start_logits, out.end_logits], -1)
    else:
        theirs = out.logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    if head == "token":
        assert hf.config.id2label[1] == "B-PER"


@pytest.mark.parametrize("head", ["span", "token", "choice"])
def test_heads_start_from_the_source(head):
    cfg = config("bert")
    torch.manual_seed(0)
    pretrained = perturbed(TaskModel(cfg, "span", 2))
    pooler = {"weight": torch.randn(cfg.hidden_size, cfg.hidden_size), "bias": torch.randn(cfg.hidden_size)}
    source = Source(cfg, pretrained.encoder.state_dict(), pooler, None, "model folder")
    model = build_task_model(source, head, 4, dropout=None, classifier_dropout=0.1)
    for key, value in pretrained.encoder.state_dict().items():
        assert torch.equal(model.encoder.state_dict()[key], value), key
    if head == "choice":  # BERT's *ForMultipleChoice keeps the pretrained pooler
        assert torch.equal(model.head.pooler.weight, pooler["weight"])
    scratch = build_task_model(source, head, 4, dropout=None, classifier_dropout=0.1, from_scratch=True)
    assert not torch.equal(scratch.encoder.state_dict()["attention.0.qkv.weight"],
                           pretrained.encoder.state_dict()["attention.0.qkv.weight"])


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("head", ["span", "token", "choice", "sequence"])
def test_host_packing_gives_the_models_own_outputs_without_packing_inside(head, unpad, monkeypatch):
    """Fine-tuning batches reach the encoder with their packing computed on the CPU (``device_batch``), as the
    pretraining loop's do: an ``unpad`` model would otherwise find the real tokens on the GPU at every forward (two
    ``nonzero`` and a ``tolist``: host syncs). The outputs are the ones the model computes for itself, for every head,
    with padded rows and with none."""
    from trainer.finetune.kind_base import device_batch, run_model
    from trainer.models import encoder as encoder_module
    cfg = config("bert").replace(unpad=unpad)
    torch.manual_seed(0)
    model = perturbed(Classifier(cfg, 3) if head == "sequence" else TaskModel(cfg, head, 3))
    for shape in ((3, 2, 12), (3, 2, 9)) if head == "choice" else ((3, 12), (4, 9)):
        ids, mask, types = inputs(cfg, shape)
        if shape[-1] == 9:  # no row padded: the host packing lets the encoder drop the mask altogether
            mask.fill_(1)
        with torch.no_grad():
            expected = model(ids, mask, types)
            moved = device_batch({"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, "cpu")
            assert (moved["packing"].batch, moved["packing"].seqlen) == (ids.numel() // shape[-1], shape[-1])
            with monkeypatch.context() as m:
                m.setattr(encoder_module, "pack", lambda *a, **k: pytest.fail("the encoder packed the batch itself"))
                got = run_model(model, moved)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
