"""ERNIE 1.0 with next-sentence prediction, as the released model was trained (PaddlePaddle/ERNIE: mask-LM loss plus
next-sentence loss on [CLS] A [SEP] B [SEP] pairs, one negative per positive, knowledge masking over both segments).

Generated English corpus, 40 documents of 6 sentences, with the entity "new york city" (three tokens) annotated by a
gazetteer side-car, so entity-level masking has units in both segments."""
import json

import numpy as np
import pytest
import torch

WORDS = "apple banana cherry grape lime melon dog egg fig hat ink jam kiwi lamp moon".split()


def _docs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        sents = []
        for _ in range(6):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(4, 9)))]
            if rng.random() < 0.5:
                words.insert(int(rng.integers(0, len(words))), "new york city")
            sents.append(" ".join(words) + " .")
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("ernie_nsp")
    (tmp / "train.txt").write_text(_docs())
    (tmp / "gazetteer.txt").write_text("new york city\tentity\n")
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(tmp / "train.txt"), "--output", str(tmp / "tok"),
                          "--vocab-size", "120", "--quiet"])
    assert build_indexed.main(["--input", str(tmp / "train.txt"), "--tokenizer", str(tmp / "tok"),
                               "--output-prefix", str(tmp / "train" / "c"),
                               "--annotate", f"gazetteer:{tmp / 'gazetteer.txt'}"]) == 0
    with open(tmp / "dialogues.jsonl", "w") as f:
        for d in range(8):
            f.write(json.dumps({"turns": [f"{WORDS[d]} {WORDS[d + 1]} new york city", WORDS[d + 2],
                                          f"{WORDS[d + 3]} {WORDS[d]}"]}) + "\n")
    return tmp, load_tokenizer(tmp / "tok")


def _config(tmp, *sets):
    from trainer.config import load_config

    return load_config("tiny_ernie", [f"data.corpora=[{{prefix: {tmp / 'train' / 'c'}}}]",
                                      f"data.cache_dir={tmp / 'cache'}", "data.format=segment-pair",
                                      "objective.options.nsp=true", "objective.options.dlm=null",
                                      "objective.options.knowledge_masking.stages=[{level: entity, start_step: 0}]",
                                      *sets])


def test_ernie_base_recipe_trains_nsp_on_segment_pairs_at_the_reference_negative_rate(repo_root):
    import yaml

    recipe = yaml.safe_load((repo_root / "trainer" / "recipes" / "ernie_base.yaml").read_text())
    assert recipe["objective"]["options"]["nsp"] is True
    assert recipe["data"]["format"] == "segment-pair" and recipe["data"]["nsp_negative_prob"] == 0.5


def test_nsp_rows_are_bert_segment_pairs_knowledge_masked_across_both_segments(corpus):
    from trainer.data.dataset import sample_rng
    from trainer.ernie.components import build_dataset
    from trainer.ernie.pairs import nsp_row
    from trainer.objectives import get_objective

    tmp, tok = corpus
    ds, _ = build_dataset(_config(tmp), tok, get_objective(_config(tmp).objective))
    entity = tok.encode("new york city")
    assert len(entity) == 3
    labels, seg1_preds, preds, seg1_tokens, tokens, b_entities = [], 0, 0, 0, 0, 0
    for position in range(160):
        row = ds[position]
        c, epoch, sample_id = ds.locate_corpus(position)
        # the unmasked row is exactly BERT's segment-pair row of the same sample and generator
        bert = ds.builders[c](sample_id, sample_rng(ds.seed, c, epoch, sample_id))
        ours = nsp_row(ds.builders[c], ds.spans[c], sample_id, sample_rng(ds.seed, c, epoch, sample_id),
                       tok.cls_id, tok.sep_id)
        assert ours["input_ids"].tolist() == bert["tokens"].tolist()
        assert ours["token_type_ids"].tolist() == bert["token_types"].tolist()
        assert row["sentence_label"] == ours["sentence_label"] == bert["sentence_label"]
        assert row["token_type_ids"].tolist() == bert["token_types"].tolist()
        unmasked = ours["input_ids"]
        # entity spans land on "new york city" in either segment, and each is masked whole or not at all
        selected = np.zeros(len(unmasked), bool)
        selected[row["mlm_positions"]] = True
        assert row["mlm_labels"].tolist() == unmasked[row["mlm_positions"]].tolist()
        for s, e, kind in ours["spans"]:
            assert unmasked[s:e].tolist() == entity
            assert selected[s:e].all() or not selected[s:e].any()
            b_entities += int(ours["token_type_ids"][s] == 1)
        types = row["token_type_ids"]
        labels.append(row["sentence_label"])
        seg1_preds += int((types[row["mlm_positions"]] == 1).sum())
        preds += len(row["mlm_positions"])
        real = ~ds.is_special[unmasked]
        seg1_tokens += int((real & (types == 1)).sum())
        tokens += int(real.sum())
    negative = np.mean(labels)
    assert 0.35 < negative < 0.65, negative  # data.nsp_negative_prob 0.5 (the reference: one negative per positive)
    # both segments are masked, in proportion to their tokens (old code: single-segment rows, 0 segment-1 tokens)
    assert seg1_tokens > 0.2 * tokens
    assert abs(seg1_preds / preds - seg1_tokens / tokens) < 0.1, (seg1_preds / preds, seg1_tokens / tokens)
    assert b_entities > 10


def _device(batch):
    """The loop's widening of a collated batch (int32 / int8 host tensors -> int64); the Packing passes through."""
    return {k: (v.long() if isinstance(v, torch.Tensor) and v.dtype in (torch.int32, torch.int8) else v)
            for k, v in batch.items()}


def test_nsp_loss_adds_to_mlm_trains_segment_one_and_dlm_steps_still_work(corpus):
    from trainer.ernie.components import build_dataset
    from trainer.ernie.data import ErnieCollator
    from trainer.objectives import get_objective

    tmp, tok = corpus
    cfg = _config(tmp, f"objective.options.dlm={{path: {tmp / 'dialogues.jsonl'}, every: 2, annotate: null}}",
                  "train.global_batch_size=4", "train.micro_batch_size=4")
    objective = get_objective(cfg.objective)
    ds, _ = build_dataset(cfg, tok, objective)
    torch.manual_seed(0)
    model = objective.build_model(cfg.model)
    assert set(model.heads.keys()) >= {"mlm", "nsp", "dlm"}
    collate = ErnieCollator(tok.pad_id, objective.options.knowledge_masking.max_predictions_per_seq)
    pair = collate(ds.__getitems__(list(range(4))))  # step 0: corpus pairs
    dialogue = collate(ds.__getitems__(list(range(4, 8))))  # step 1: DLM
    assert "sentence_label" in pair and "role_ids" not in pair
    assert "role_ids" in dialogue and "sentence_label" not in dialogue
    batch = _device(pair)
    loss, metrics = objective.loss(model, batch)
    assert {"mlm_loss", "nsp_loss", "nsp_acc"} <= set(metrics)
    loss.backward()
    segment = model.encoder.embeddings.token_type.weight.grad
    assert segment[1].abs().sum() > 0  # segment 1 is trained (old code: never, no pair rows)
    assert model.heads["nsp"].classifier.weight.grad.abs().sum() > 0
    model.zero_grad()
    batch = _device(dialogue)
    loss, metrics = objective.loss(model, batch)
    assert {"dlm_loss", "dlm_mlm_loss"} <= set(metrics) and "nsp_loss" not in metrics
    loss.backward()


def test_export_maps_the_nsp_head_not_dlm_to_seq_relationship(tmp_path):
    transformers = pytest.importorskip("transformers")
    from trainer.models import get_preset
    from trainer.models.hf_convert import export_hf
    from trainer.objectives.ernie import ErnieObjective

    torch.manual_seed(0)
    cfg = get_preset("tiny-ernie", extra_embeddings={"role": 2}, segment_alternatives=["role"], dropout=0.0,
                     attention_dropout=0.0)
    objective = ErnieObjective({"nsp": True, "dlm": {"path": "unused.jsonl"}})
    model = objective.build_model(cfg).eval()
    export_hf(cfg, model.state_dict(), tmp_path / "hf")
    hf = transformers.ErnieForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 10))
    mask = torch.ones_like(ids)
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    with torch.no_grad():
        ours = model(ids, mask, types, None, torch.zeros(0, dtype=torch.long))
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).seq_relationship_logits
    assert torch.allclose(ours["nsp"], theirs, atol=1e-5), (ours["nsp"], theirs)
    assert not torch.allclose(ours["dlm"], theirs, atol=1e-3)
