"""ERNIE DLM: dialogue samples (roles, real/fake turns, masking inside turns) and the embedding isolation between
DLM and MLM batches on the real encoder."""
import json
import re
from collections import Counter

import numpy as np
import pytest
import torch

from trainer.ernie.dlm import DialogueFile, collate_masked, dlm_sample
from trainer.ernie.knowledge_masking import KnowledgeMaskingConfig


@pytest.fixture(scope="module")
def zh(tmp_path_factory, zh_corpus):
    from test_annotate import _zh_tokenizer_dir

    from data_prep.tokenizer import load_tokenizer

    tmp = tmp_path_factory.mktemp("dlm")
    tok_dir = _zh_tokenizer_dir(tmp, zh_corpus)
    lines = [l.strip() for l in zh_corpus.read_text(encoding="utf-8").splitlines()[:2000] if len(l.strip()) > 4]
    path = tmp / "dialogues.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for d in range(60):  # dialogues of 3..6 turns made of consecutive corpus lines
            n = 3 + d % 4
            turns = lines[d * 6:d * 6 + n]
            if d % 2:
                f.write(json.dumps({"turns": turns}, ensure_ascii=False) + "\n")
            else:
                roles = ["Q", "Q", "R", "R", "Q", "R"][:n]
                f.write(json.dumps({"turns": [{"role": r, "text": t} for r, t in zip(roles, turns)]},
                                   ensure_ascii=False) + "\n")
        f.write(json.dumps({"turns": ["单独一轮"]}, ensure_ascii=False) + "\n")  # too short: skipped
    return load_tokenizer(tok_dir), tok_dir, path


def test_dialogue_file_roles_and_errors(zh, tmp_path):
    tok, _, path = zh
    dialogues = DialogueFile(path, tok)
    assert len(dialogues) == 60 and dialogues.skipped == 1
    assert dialogues.roles[1].tolist() == [0, 1, 0, 1]              # plain strings alternate Q, R
    assert dialogues.roles[0].tolist() == [0, 0, 1]                  # explicit QQR
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": [{"role": "X", "text": "a"}, "b"]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: turns must all be strings"):
        DialogueFile(bad, tok)


def test_dlm_samples_layout_and_real_fake_turns(zh):
    tok, _, path = zh
    dialogues = DialogueFile(path, tok)
    rng = np.random.default_rng(0)
    fakes = 0
    for i in range(400):
        s = dlm_sample(dialogues, i, rng, max_len=64, cls_id=tok.cls_id, sep_id=tok.sep_id, num_turns=3)
        ids, roles = s["input_ids"], s["role_ids"]
        assert len(ids) == len(roles) <= 64 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
        seps = np.flatnonzero(ids == tok.sep_id)
        assert len(seps) == 3
        bounds = np.concatenate([[0], seps + 1])
        turns = [ids[bounds[k] + (k == 0):seps[k]] for k in range(3)]
        d = i % len(dialogues)
        src = s["source"]
        for k, (sd, st) in enumerate(src):  # each slot holds (a prefix of) the turn it names, with its role
            assert turns[k].tolist() == dialogues.turns[sd][st][:len(turns[k])].tolist() and len(turns[k]) > 0
            assert set(roles[bounds[k] + (k == 0):seps[k] + 1].tolist()) == {int(dialogues.roles[sd][st])}
        own = [k for k, (sd, _) in enumerate(src) if sd == d]
        if s["dlm_label"]:  # fake: exactly one slot from another dialogue, with the role of the turn it replaced
            assert len(own) == 2 and src[s["replaced_turn"]][0] != d
        else:  # real: consecutive turns of its own dialogue
            assert len(own) == 3 and [t for _, t in src] == list(range(src[0][1], src[0][1] + 3))
        if s["dlm_label"]:
            k = s["replaced_turn"]
            start = src[own[0]][1] - own[0]  # the window's first turn in its own dialogue
            assert int(dialogues.roles[src[k][0]][src[k][1]]) == int(dialogues.roles[d][start + k])
        fakes += s["dlm_label"]
    assert abs(fakes / 400 - 0.5) < 5 * np.sqrt(0.25 / 400)


def test_knowledge_masking_inside_turns(zh, tmp_path):
    from data_prep.annotate import GazetteerAnnotator

    tok, tok_dir, path = zh
    texts = [t for line in open(path, encoding="utf-8") for t in json.loads(line)["turns"]]
    # a gazetteer of the dialogues' 12 most frequent two-character words (Han bigrams)
    texts = [t if isinstance(t, str) else t["text"] for t in texts]
    han = re.compile(r"[\u4e00-\u9fff]{2}")
    bigrams = Counter(t[i:i + 2] for t in texts for i in range(len(t) - 1) if han.fullmatch(t[i:i + 2]))
    words = sorted(w for w, _ in bigrams.most_common(12))
    gaz = tmp_path / "gaz.txt"
    gaz.write_text("\n".join(words) + "\n", encoding="utf-8")
    dialogues = DialogueFile(path, tok, annotator=GazetteerAnnotator(gaz), tokenizer_dir=tok_dir)
    rng = np.random.default_rng(1)
    samples = [dlm_sample(dialogues, i, rng, 96, tok.cls_id, tok.sep_id) for i in range(300)]
    assert sum(len(s["spans"]) for s in samples) > 100
    cfg = KnowledgeMaskingConfig(max_predictions_per_seq=20)
    batch = collate_masked(samples, tok.pad_id, tok.special_ids, tok.word_start, cfg, "entity", tok.mask_id,
                           np.arange(5, tok.vocab_size), rng, keys={"role_ids": 0, "dlm_label": 0})
    selected = np.zeros_like(batch["input_ids"], bool)
    for b in range(len(samples)):
        p = batch["mlm_positions"][b][batch["mlm_labels"][b] != -100]
        selected[b, p] = True
    whole = 0
    for b, s in enumerate(samples):
        for start, end, _ in s["spans"].tolist():
            n = int(selected[b, start:end].sum())
            assert n in (0, end - start)
            whole += n > 0 and end - start > 1
            assert not np.isin(batch["input_ids"][b, start:end], [tok.sep_id, tok.cls_id]).any()
    assert whole > 20
    assert batch["role_ids"].shape == batch["input_ids"].shape and batch["dlm_label"].shape == (300,)


def test_role_embeddings_trained_only_by_dlm_batches_segment_only_by_mlm():
    from trainer.models import get_preset
    from trainer.objectives.ernie import ErnieObjective

    torch.manual_seed(0)
    cfg = get_preset("tiny", extra_embeddings={"role": 2}, segment_alternatives=["role"], family="ernie",
                     dropout=0.0, attention_dropout=0.0)
    obj = ErnieObjective({"dlm": {"path": "dialogues.jsonl"}})
    model = obj.build_model(cfg)
    B, T = 4, 16
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    common = {"input_ids": ids, "attention_mask": torch.ones(B, T, dtype=torch.long),
              "mlm_positions": torch.tensor([[1, 3]] * B), "mlm_labels": ids[:, [1, 3]]}
    mlm_batch = dict(common, token_type_ids=torch.cat([torch.zeros(B, T // 2), torch.ones(B, T // 2)], 1).long())
    dlm_batch = dict(common, role_ids=torch.randint(0, 2, (B, T), generator=g), dlm_label=torch.tensor([0, 1, 0, 1]))
    emb = model.encoder.embeddings

    def grads(batch):
        model.zero_grad(set_to_none=True)
        loss, metrics = obj.loss(model, batch)
        loss.backward()
        seg, role = emb.token_type.weight.grad, emb.extra["role"].weight.grad
        return (0.0 if seg is None else seg.abs().sum().item()), (0.0 if role is None else role.abs().sum().item()), \
            metrics

    seg, role, metrics = grads(dlm_batch)
    assert seg == 0.0 and role > 0.0 and "dlm_loss" in metrics
    seg, role, metrics = grads(mlm_batch)
    assert seg > 0.0 and role == 0.0 and "dlm_loss" not in metrics
    with pytest.raises(ValueError, match="segment_alternatives"):
        obj.heads(get_preset("tiny"))


def test_cached_dialogues_equal_the_in_memory_ones_and_are_built_once(zh, tmp_path, monkeypatch):
    """The trainer's path (``cache``): the first open tokenizes and annotates (here in a pool of 2 spawned workers)
    and writes the cache file, the next opens map it without reading the jsonl again; turns, roles and spans equal
    the in-memory build's. Another dialogue file content makes another cache file."""
    import trainer.ernie.dlm as dlm
    from trainer.data.cache_file import CachePolicy, is_mapped

    tok, tok_dir, path = zh
    texts = [t if isinstance(t, str) else t["text"] for line in open(path, encoding="utf-8")
             for t in json.loads(line)["turns"]]
    han = re.compile(r"[\u4e00-\u9fff]{2}")
    bigrams = Counter(t[i:i + 2] for t in texts for i in range(len(t) - 1) if han.fullmatch(t[i:i + 2]))
    gaz = tmp_path / "gaz.txt"
    gaz.write_text("\n".join(w for w, _ in bigrams.most_common(12)) + "\n", encoding="utf-8")
    spec = f"gazetteer:{gaz}"  # what the pool's workers rebuild the annotator from
    ref = DialogueFile(path, tok, annotator=spec, tokenizer_dir=tok_dir)
    assert sum(len(s) for d in range(len(ref)) for s in ref.spans[d]) > 50
    monkeypatch.setattr(dlm, "PARALLEL_MIN_TURNS", 10)  # checked in this process: the pool path for 60 dialogues
    reads = []
    real_read = dlm._read_dialogues
    monkeypatch.setattr(dlm, "_read_dialogues", lambda *a: reads.append(a) or real_read(*a))
    cache = CachePolicy(tmp_path / "cache")
    first = DialogueFile(path, tok, annotator=spec, tokenizer_dir=tok_dir, cache=cache, workers=2)
    again = DialogueFile(path, tok, annotator=spec, tokenizer_dir=tok_dir, cache=cache, workers=2)
    assert len(reads) == 1 and len(list((tmp_path / "cache").glob("dialogues-*.bfc"))) == 1
    assert is_mapped(again._tokens) and again.skipped == ref.skipped == 1
    for got in (first, again):
        assert len(got) == len(ref) == 60
        for d in range(len(ref)):
            assert got.roles[d].tolist() == ref.roles[d].tolist()
            assert [t.tolist() for t in got.turns[d]] == [t.tolist() for t in ref.turns[d]]
            assert [s.tolist() for s in got.spans[d]] == [s.tolist() for s in ref.spans[d]]
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    for i in range(50):  # the samples drawn from them, fake turns included
        a = dlm_sample(ref, i, rng_a, 64, tok.cls_id, tok.sep_id)
        b = dlm_sample(again, i, rng_b, 64, tok.cls_id, tok.sep_id)
        assert a["source"] == b["source"]
        assert all(np.array_equal(a[k], b[k]) for k in ("input_ids", "role_ids", "spans"))
    other = tmp_path / "other.jsonl"
    extra = json.dumps({"turns": ["再来一轮", "好的"]}, ensure_ascii=False)
    other.write_text(path.read_text(encoding="utf-8") + extra + "\n", encoding="utf-8")
    assert len(DialogueFile(other, tok, annotator=spec, tokenizer_dir=tok_dir, cache=cache)) == 61
    assert len(list((tmp_path / "cache").glob("dialogues-*.bfc"))) == 2
