"""Fine-tuning starts from every family's own checkpoint (BERT model folder, RoBERTa/ALBERT/ERNIE Hugging Face
exports, ELECTRA's generator+discriminator folder), with the heads Hugging Face's *ForSequenceClassification classes
put there (logits compared with transformers'), ELECTRA's layer-wise learning rates, and clear errors before any
training for an unsupported family or a tokenizer that does not belong to the model. Short CPU runs, fp32."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fork_server
from finetune_tasks import corpus_documents, write_cola, write_pairs, write_sts
from trainer.finetune.__main__ import main as finetune_main
from trainer.finetune.model import build_classifier, load_source, optimizer_groups
from trainer.models import ElectraPretrainingModel, PretrainingModel, get_preset
from trainer.models.electra import DISCRIMINATOR_HEADS
from trainer.models.hf_convert import export_hf
from trainer.models.model_folder import save_model_folder
from trainer.models.presets import ALBERT_HEADS, BERT_HEADS, ROBERTA_HEADS

REPO = Path(__file__).resolve().parents[1]
FAMILIES = {  # family: (preset, heads, tokenizer kind, saved as, task)
    "bert": ("tiny", BERT_HEADS, "wordpiece", "model folder", "cola"),
    "roberta": ("tiny-roberta", ROBERTA_HEADS, "bbpe", "hugging face", "sts-b"),
    "albert": ("tiny-albert", ALBERT_HEADS, "wordpiece", "hugging face", "mrpc"),
    "electra": ("tiny-electra", None, "wordpiece", "model folder", "rte"),
    "ernie": ("tiny-ernie", BERT_HEADS, "wordpiece", "hugging face", "mnli"),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory, en_corpus):
    out = tmp_path_factory.mktemp("finetune")
    text = out / "en.txt"
    text.write_text("\n".join(en_corpus.read_text(encoding="utf-8").splitlines()[:6000]) + "\n", encoding="utf-8")
    for kind in ("wordpiece", "bbpe"):
        proc = subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--kind", kind, "--input", str(text),
                               "--vocab-size", "800", "--output", str(out / kind)], cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    docs = corpus_documents(en_corpus, 6000, 9000)
    write_cola(docs, out / "cola", 48, 24)
    write_sts(docs, out / "sts-b", 48, 24)
    for task in ("mrpc", "rte", "mnli"):
        write_pairs(task, docs, out / task, 48, 24)
    return out


def perturbed(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def make_source(work: Path, family: str) -> tuple[Path, torch.nn.Module]:
    """The family's pretraining model with perturbed weights, saved the way that family's row says."""
    from data_prep.tokenizer import load_tokenizer
    preset, heads, kind, saved, _ = FAMILIES[family]
    tok = load_tokenizer(work / kind)
    cfg = get_preset(preset, vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, dropout=0.0, attention_dropout=0.0,
                     **({"position_offset": tok.pad_id + 1} if family == "roberta" else {}))
    torch.manual_seed(0)
    model = perturbed(ElectraPretrainingModel(cfg) if family == "electra" else PretrainingModel(cfg, heads))
    folder = work / f"src_{family}"
    if folder.exists():
        return folder, model
    if saved == "model folder":
        save_model_folder(model, cfg, folder)
        for f in (work / kind).iterdir():
            shutil.copy(f, folder / f.name)
    else:
        export_hf(cfg, model.state_dict(), folder, work / kind)
    return folder, model


@pytest.fixture
def clean_env():
    """In-process runs make their own 1-rank process group: the environment after them is the one before (issue 12:
    RANK/WORLD_SIZE/MASTER_PORT left behind reached every later test's launchers), and the group, which fine-tuning
    leaves up on purpose, is destroyed after the test when it was not up before it."""
    saved = dict(os.environ)
    grouped = torch.distributed.is_initialized()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster than two contending on a shared machine
    yield
    torch.set_num_threads(threads)
    launch = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    left = {k: (saved.get(k), os.environ.get(k)) for k in launch if saved.get(k) != os.environ.get(k)}
    os.environ.clear()
    os.environ.update(saved)  # (imports set some process-wide variables on purpose: scikit-learn's KMP_*, ...)
    if torch.distributed.is_initialized() and not grouped:  # fine-tuning leaves its 1-rank group up on purpose
        import deepspeed.comm
        deepspeed.comm.destroy_process_group()  # also drops DeepSpeed's cached handles to the group's clones
    assert not left, f"fine-tuning in-process left these in os.environ (before, after): {left}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_classifier_starts_from_the_checkpoint_with_hugging_face_heads(family, work):
    import transformers
    folder, model = make_source(work, family)
    source = load_source(folder)
    assert source.cfg.family == family and source.kind == FAMILIES[family][3]
    clf = build_classifier(source, 3, dropout=0.0, classifier_dropout=0.0).eval()
    pre = model.discriminator if family == "electra" else model
    vocab = pre.cfg.vocab_size  # the vocabulary padding rows (perturbed here) do not travel through a HF folder
    for key, value in pre.encoder.state_dict().items():
        got = clf.encoder.state_dict()[key]
        if key == "embeddings.word.weight":
            got, value = got[:vocab], value[:vocab]
        torch.testing.assert_close(got, value, rtol=0, atol=1e-6, msg=key)
    # The same classifier in transformers: the exported encoder, the pretrained pooler where HF keeps one, and our
    # classifier's weights copied in; equal logits mean our head is the one the export would be fine-tuned with.
    hf_dir = work / f"hf_{family}"
    if not hf_dir.exists():
        export_hf(model.cfg, model.state_dict(), hf_dir)
    cls = getattr(transformers, f"{ {'ernie': 'Ernie', 'bert': 'Bert', 'roberta': 'Roberta', 'albert': 'Albert', 'electra': 'Electra'}[family]}ForSequenceClassification")
    hf = cls.from_pretrained(hf_dir, num_labels=3, local_files_only=True).eval()
    head = clf.head
    with torch.no_grad():
        if family in ("roberta", "electra"):
            hf.classifier.dense.weight.copy_(head.pooler.weight)
            hf.classifier.dense.bias.copy_(head.pooler.bias)
            hf.classifier.out_proj.weight.copy_(head.classifier.weight)
            hf.classifier.out_proj.bias.copy_(head.classifier.bias)
        else:
            hf.classifier.weight.copy_(head.classifier.weight)
            hf.classifier.bias.copy_(head.classifier.bias)
    cfg = source.cfg
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.vocab_size, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    ids[mask == 0] = cfg.pad_token_id
    types = torch.zeros_like(ids)
    with torch.no_grad():
        ours = clf(ids, mask, types)
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_fine_tunes_from_its_own_checkpoint(family, work, clean_env):
    folder, _ = make_source(work, family)
    task = FAMILIES[family][4]
    out = work / f"run_{family}"
    code = finetune_main(["--checkpoint", str(folder), "--task", task, "--data", str(work / task),
                          "--set", f"run_dir={out}", "--set", "train.epochs=1", "--set", "train.global_batch_size=16",
                          "--set", "train.micro_batch_size=8", "--set", "optim.lr=1e-3",
                          "--set", "deepspeed.config=ds_configs/zero0.json"]
                         + (["--set", "optim.layer_decay=0.8"] if family == "electra" else []))
    assert code == 0
    res = json.loads((out / "finetune" / task / "results.json").read_text())
    assert res["family"] == family and res["examples"]["train"] == 48
    (run,) = res["runs"]
    assert run["steps"] == 3 and run["seed"] == 1234
    expected = {"cola": {"dev": ["matthews"]}, "sts-b": {"dev": ["spearman", "pearson"]},
                "mrpc": {"dev": ["f1", "accuracy"]}, "rte": {"dev": ["accuracy"]},
                "mnli": {"matched": ["accuracy"], "mismatched": ["accuracy"]}}[task]
    assert {split: list(m) for split, m in run["metrics"].items()} == expected
    for scores in run["metrics"].values():
        assert all(-1.0 <= v <= 1.0 for v in scores.values())


def test_electra_layer_wise_learning_rates(work):
    folder, _ = make_source(work, "electra")
    clf = build_classifier(load_source(folder), 2, None, 0.1)
    L, lr, d = clf.cfg.num_layers, 1e-3, 0.8
    groups = optimizer_groups(clf, lr, 0.01, d)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(clf.named_parameters())
    # ELECTRA's _get_layer_lrs: depth 0 embeddings, i + 1 layer i, L + 2 task head; lr x decay^(L + 2 - depth)
    assert lr_of[id(named["encoder.embeddings.word.weight"])] == (pytest.approx(lr * d ** (L + 2)), 0.01)
    assert lr_of[id(named["encoder.project.weight"])][0] == pytest.approx(lr * d ** (L + 2))
    assert lr_of[id(named["encoder.attention.0.qkv.weight"])] == (pytest.approx(lr * d ** (L + 1)), 0.01)
    assert lr_of[id(named[f"encoder.ffn.{L - 1}.norm.weight"])] == (pytest.approx(lr * d ** 2), 0.0)
    assert lr_of[id(named["head.classifier.weight"])] == (pytest.approx(lr), 0.01)
    assert sum(len(g["params"]) for g in groups) == len(named)
    from trainer.engine import build_optimizer
    from trainer.finetune.config import FinetuneOptim
    opt = build_optimizer(FinetuneOptim(lr=lr, layer_decay=d), clf, "cpu", {}, groups=groups)
    assert sorted(g["lr"] for g in opt.param_groups) == sorted(g["lr"] for g in groups)
    albert, _ = make_source(work, "albert")
    with pytest.raises(ValueError, match="shares them"):
        optimizer_groups(build_classifier(load_source(albert), 2, None, 0.1), lr, 0.01, d)


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return fork_server.run([sys.executable, "-m", "trainer.finetune", *args], cwd=REPO, timeout=300)


def test_bad_checkpoints_and_tokenizers_fail_before_training(work, tmp_path, capsys, clean_env):
    bert, _ = make_source(work, "bert")
    base = ["--task", "cola", "--data", str(work / "cola"), "--set", f"run_dir={tmp_path}"]
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    cases = [
        (["--checkpoint", str(gpt)], "a Hugging Face 'gpt2' model; fine-tuning supports the families"),
        (["--checkpoint", str(tmp_path / "nowhere")], "no such folder"),
        (["--checkpoint", str(bert), "--set", f"tokenizer={work / 'bbpe'}"], "pads with id 1, the model with 0"),
        (["--checkpoint", str(bert), "--task", "mnli"], "lacks ['dev_matched.tsv', 'dev_mismatched.tsv']"),
        (["--checkpoint", str(bert), "--set", "optim.lr=-1"], "optim.lr: Input should be greater than 0"),
        (["--checkpoint", str(bert), "--set", "train.globl_batch=3"], "unknown key"),
        (["--checkpoint", str(bert), "--task", "squadx"], "unknown task 'squadx'"),
        (["--checkpoint", str(bert), "--task", "squad"], "task squad: "),  # a GLUE folder has no SQuAD files
    ]
    for extra, message in cases:
        code = finetune_main(base + extra)
        err = capsys.readouterr().err
        assert code == 2 and message in err, (extra, err)
    small = tmp_path / "small_vocab"  # the tokenizer has more tokens than the model's embedding table
    cfg = get_preset("tiny", vocab_size=500, pad_token_id=0)
    save_model_folder(PretrainingModel(cfg, BERT_HEADS), cfg, small)
    assert finetune_main(base + ["--checkpoint", str(small), "--set", f"tokenizer={work / 'wordpiece'}"]) == 2
    assert "has 800 tokens but the model's embedding table has 500 rows" in capsys.readouterr().err
    assert not (tmp_path / "finetune").exists()  # nothing was trained or written


@pytest.mark.slow
def test_every_new_kind_runs_from_the_cli_and_exports(work, tmp_path, clean_env):
    """Issue 24's kinds end to end in one epoch each (BERT model folder): squad as v2.0 (unanswerable questions
    detected, null threshold), race (per high/middle), jsonl (CLUE lines), ner; each run's model is exported
    (train.export_dir) and loads in transformers' Auto class for its head. Learning is checked in
    test_finetune_downstream.py; this checks the plumbing and what results.json holds."""
    import csv

    import transformers

    from finetune_tasks import write_topic_choice, write_topic_ner, write_topic_span
    bert, _ = make_source(work, "bert")
    span = write_topic_span(tmp_path / "span", 24, 12)
    v2 = tmp_path / "v2"
    v2.mkdir()
    for src, dst in (("train-v1.1.json", "train-v2.0.json"), ("dev-v1.1.json", "dev-v2.0.json")):
        d = json.loads((span / src).read_text())
        for p in d["data"][0]["paragraphs"][::3]:
            p["qas"][0].update(is_impossible=True, answers=[])
        (v2 / dst).write_text(json.dumps(d))
    rows = list(csv.DictReader((write_topic_choice(tmp_path / "mc", 16, 8) / "train.csv").open()))
    race = tmp_path / "race"
    for split in ("train", "dev"):
        for group, part in (("high", rows[:8]), ("middle", rows[8:])):
            (race / split / group).mkdir(parents=True)
            (race / split / group / "a.txt").write_text(json.dumps({
                "id": group, "article": part[0]["sent1"], "questions": ["_"] * len(part),
                "options": [[r[f"ending{k}"] for k in range(4)] for r in part],
                "answers": ["ABCD"[int(r["label"])] for r in part]}))
    clue = tmp_path / "clue"
    clue.mkdir()
    for split in ("train", "dev"):
        (clue / f"{split}.json").write_text("".join(json.dumps({"sentence": r["sent1"], "label": int(r["label"]) % 2})
                                                    + "\n" for r in rows))
    cases = {"squad": (v2, ["--set", "task.doc_stride=16"], "AutoModelForQuestionAnswering",
                       {"f1", "exact_match", "f1_threshold0", "exact_match_threshold0", "f1_null_threshold",
                        "exact_match_null_threshold"}),
             "race": (race, [], "AutoModelForMultipleChoice", {"accuracy", "accuracy_high", "accuracy_middle"}),
             "jsonl": (clue, ["--set", "task.labels=[0,1]"], "AutoModelForSequenceClassification", {"accuracy"}),
             "ner": (write_topic_ner(tmp_path / "ner", 16, 8), [], "AutoModelForTokenClassification",
                     {"f1", "precision", "recall", "accuracy", "f1_T0", "f1_T1"})}
    for task, (data, extra, auto, metrics) in cases.items():
        out = tmp_path / f"run_{task}"
        code = finetune_main(["--checkpoint", str(bert), "--task", task, "--data", str(data), "--set", f"run_dir={out}",
                              "--set", "train.epochs=1", "--set", "train.global_batch_size=8", "--set",
                              "train.micro_batch_size=8", "--set", "train.max_seq_length=64", "--set",
                              "deepspeed.config=ds_configs/zero0.json", "--set", f"train.export_dir={out / 'hf'}",
                              *extra])
        assert code == 0, task
        res = json.loads((out / "finetune" / task / "results.json").read_text())
        assert set(res["best"]["dev"]) == metrics, (task, res["best"])
        model = getattr(transformers, auto).from_pretrained(out / "hf" / "0_seed1234", local_files_only=True)
        assert type(model).__name__.startswith("Bert"), task
    assert json.loads((tmp_path / "run_ner" / "hf" / "0_seed1234" / "config.json").read_text())["id2label"] == \
        {"0": "O", "1": "B-T0", "2": "B-T1"}


@pytest.mark.parametrize("family,kind,layout", [("bert", "wordpiece", {"vocab.txt"}),
                                                ("roberta", "bbpe", {"vocab.json", "merges.txt"})])
def test_released_tokenizer_layouts_without_tokenizer_json(family, kind, layout, work, tmp_path, clean_env):
    """Released model folders often ship their tokenizer as vocab.txt (bert-base-uncased, ERNIE) or vocab.json +
    merges.txt (roberta-base) without tokenizer.json; transformers.AutoTokenizer reads them, so fine-tuning does. Both
    were refused ("the hugging face names none"; and with tokenizer=DIR, "bertfamily_tokenizer.json is missing"). The
    fine-tuned export keeps the task's label names (id2label was LABEL_0, LABEL_1 for GLUE/tsv/jsonl)."""
    import transformers

    from data_prep.tokenizer import load_tokenizer
    from trainer.finetune.model import HFTokenizer, load_tokenizer_for
    _, model = make_source(work, family)
    folder = tmp_path / "released"
    export_hf(model.cfg, model.state_dict(), folder)
    transformers.AutoTokenizer.from_pretrained(str(work / kind)).save_pretrained(folder)  # tokenizer_config.json
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    (folder / "tokenizer.json").unlink()  # what remains is the older layout, written as released folders have it:
    if kind == "wordpiece":
        vocab = sorted(spec["vocab"], key=spec["vocab"].get)
        (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    else:
        (folder / "vocab.json").write_text(json.dumps(spec["vocab"], ensure_ascii=False), encoding="utf-8")
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
        (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in merges), encoding="utf-8")
    assert layout <= {p.name for p in folder.iterdir()} and not (folder / "bertfamily_tokenizer.json").exists()
    source = load_source(folder)
    tok = load_tokenizer_for(source, None)
    assert isinstance(tok, HFTokenizer) and source.tokenizer_dir == folder
    ours = load_tokenizer(work / kind)
    texts = (work / "cola" / "train.tsv").read_text(encoding="utf-8").splitlines()[:20]
    assert [tok.encode(t) for t in texts] == [ours.encode(t) for t in texts]
    if family != "bert":
        return
    out = tmp_path / "run"
    code = finetune_main(["--checkpoint", str(folder), "--task", "rte", "--data", str(work / "rte"),
                          "--set", f"run_dir={out}", "--set", "train.epochs=1", "--set", "train.global_batch_size=16",
                          "--set", "train.micro_batch_size=16", "--set", f"train.export_dir={out / 'export'}",
                          "--set", "deepspeed.config=ds_configs/zero0.json"])
    assert code == 0
    (exported,) = (out / "export").iterdir()
    config = json.loads((exported / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}


def test_fine_tuning_an_unpadded_model_packs_its_batches_on_the_host(work, tmp_path, clean_env, monkeypatch):
    """An ``unpad`` checkpoint (every GPU recipe's) fine-tunes with each training and evaluation batch packed on the
    CPU before it is moved (``kind_base.device_batch``): the encoder never packs one itself, which on a GPU is two
    ``nonzero`` and a ``tolist`` (host syncs) per forward. On the CPU this proves the packing is handed over, not
    what a GPU's stream does with it."""
    from data_prep.tokenizer import load_tokenizer
    from trainer.models import encoder as encoder_module
    tok = load_tokenizer(work / "wordpiece")
    cfg = get_preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, dropout=0.0, attention_dropout=0.0,
                     unpad=True)
    torch.manual_seed(0)
    folder = tmp_path / "src"
    save_model_folder(perturbed(PretrainingModel(cfg, BERT_HEADS)), cfg, folder)
    for f in (work / "wordpiece").iterdir():
        shutil.copy(f, folder / f.name)
    monkeypatch.setattr(encoder_module, "pack", lambda *a, **k: pytest.fail("the encoder packed a batch itself"))
    code = finetune_main(["--checkpoint", str(folder), "--task", "mrpc", "--data", str(work / "mrpc"),
                          "--set", f"run_dir={tmp_path / 'run'}", "--set", "train.epochs=1",
                          "--set", "train.global_batch_size=16", "--set", "train.micro_batch_size=8",
                          "--set", "deepspeed.config=ds_configs/zero0.json"])
    assert code == 0
    (run,) = json.loads((tmp_path / "run" / "finetune" / "mrpc" / "results.json").read_text())["runs"]
    assert run["steps"] == 3 and set(run["metrics"]["dev"]) == {"f1", "accuracy"}
