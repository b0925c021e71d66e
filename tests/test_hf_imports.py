"""Hugging Face folders from elsewhere (the hub's layouts, other trainers' saves) through ``checkpoint.init_from`` and
fine-tuning's ``--checkpoint``: weights that do not match their config are refused, never filled with random values;
an ELECTRA discriminator folder alone continues as the discriminator of a pair.

The folders are made by transformers itself (``save_pretrained``, or ``torch.save`` of a state dict the way other
trainers write ``pytorch_model.bin``) at tiny sizes; what the hub serves at full size is not downloaded (no network)."""
import pytest
import torch
import transformers

from trainer import init_from
from trainer.finetune.model import SourceError, load_source
from trainer.models import ElectraPretrainingModel, PretrainingModel, get_preset
from trainer.models.hf_convert import export_hf, import_hf
from trainer.models.presets import BERT_HEADS
from trainer.pretrain import load_init_weights

VOCAB = 64


def _bert_folder(tmp_path, name: str, edit=None, cls=transformers.BertForPreTraining, **cfg_kwargs):
    """A tiny folder: config.json + pytorch_model.bin holding ``edit(state_dict)`` of a seeded model (the decoder
    weight left out, as released BERT files hold it once); returns (folder, reference model)."""
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=40,
                                  architectures=["BertForMaskedLM"], **cfg_kwargs)
    torch.manual_seed(0)
    ref = cls(cfg)
    sd = {k: v for k, v in ref.state_dict().items() if "decoder.weight" not in k}
    folder = tmp_path / name
    cfg.save_pretrained(folder)
    torch.save(edit(sd) if edit else sd, folder / "pytorch_model.bin")
    return folder, ref


BROKEN = {
    "module": (lambda sd: {f"module.{k}": v for k, v in sd.items()}, r"start with 'module\.': a wrapper's state dict"),
    "model": (lambda sd: {f"model.{k}": v for k, v in sd.items()}, r"start with 'model\.': a wrapper's state dict"),
    "layer": (lambda sd: {k: v for k, v in sd.items() if ".layer.1." not in k},
              r"16 of the \d+ tensors .*bert\.encoder\.layer\.1\..*The file is incomplete"),
    "word": (lambda sd: {k: v for k, v in sd.items() if "word_embeddings" not in k},
             r"1 of the \d+ tensors .*\['bert\.embeddings\.word_embeddings\.weight'\]"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_weights_that_do_not_match_the_config_are_refused_everywhere(case, tmp_path):
    """Before: every one of these imported with transformers' random init in the gaps and printed only "initialised
    from X" (0 of 197 tensors the file's for a `module.` bert-base), and fine-tuning scored a random model."""
    edit, said = BROKEN[case]
    folder, _ = _bert_folder(tmp_path, case, edit)
    with pytest.raises(ValueError, match=said):
        import_hf(folder)
    with pytest.raises(ValueError, match=rf"checkpoint\.init_from {folder}: .*its weights do not match"):
        init_from.init_weights(folder, tmp_path / "run", rank=0)
    with pytest.raises(SourceError, match=rf"--checkpoint {folder}: .*its weights do not match"):
        load_source(folder)


def test_roberta_and_electra_path_refuses_too_and_drops_heads_the_file_lacks(tmp_path):
    """RoBERTa/ELECTRA are read through their named class, which had no loading report at all."""
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=40, pad_token_id=1,
                                     architectures=["RobertaForMaskedLM"])
    torch.manual_seed(0)
    ref = transformers.RobertaForMaskedLM(cfg)
    cfg.save_pretrained(tmp_path / "module")
    torch.save({f"module.{k}": v for k, v in ref.state_dict().items()}, tmp_path / "module" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"roberta\.embeddings.*start with 'module\.'"):
        import_hf(tmp_path / "module")
    # the body alone (no lm_head): imported exactly, the MLM head dropped (a new one is named by init_from) rather
    # than transformers' random one taken as the folder's
    cfg.save_pretrained(tmp_path / "body")
    torch.save({k: v for k, v in ref.state_dict().items() if not k.startswith("lm_head.")},
               tmp_path / "body" / "pytorch_model.bin")
    _, state = import_hf(tmp_path / "body")
    assert not any(k.startswith("heads.") for k in state)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.roberta.embeddings.word_embeddings.weight)


def test_a_proper_folder_still_imports_exactly(tmp_path):
    """Released layouts that are whole: the word embedding stored only as the tied decoder, and BertModel keys
    without the `bert.` prefix, are not refused."""
    folder, ref = _bert_folder(tmp_path, "ok")
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.bert.embeddings.word_embeddings.weight)
    assert torch.equal(state["encoder.ffn.1.inner.weight"], ref.bert.encoder.layer[1].intermediate.dense.weight)
    assert {k.split(".")[1] for k in state if k.startswith("heads.")} == {"mlm", "nsp"}

    def tied_only(sd):
        sd = {k: v for k, v in sd.items() if "word_embeddings" not in k}
        return {**sd, "cls.predictions.decoder.weight": ref.bert.embeddings.word_embeddings.weight}
    folder, ref = _bert_folder(tmp_path, "tied", tied_only)
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.embeddings.word.weight"][:VOCAB], ref.bert.embeddings.word_embeddings.weight)
    folder, ref = _bert_folder(tmp_path, "bare", lambda sd: {k[5:]: v for k, v in sd.items() if k.startswith("bert.")})
    _, state = import_hf(folder)
    assert torch.equal(state["encoder.ffn.1.inner.weight"], ref.bert.encoder.layer[1].intermediate.dense.weight)
    assert not any(k.startswith("heads.mlm.") for k in state)


def test_electra_discriminator_folder_alone_continues_as_the_discriminator(tmp_path):
    """The hub ships google/electra-*-discriminator without its generator. Before: init_from into an ELECTRA run
    stopped with "the source lacks 62 of this model's 62 encoder tensors". Now the folder is the discriminator and the
    generator starts new, said in one line; the generator/ nesting keeps giving both. The folders are written by
    transformers' save_pretrained (through our export)."""
    cfg = get_preset("tiny-electra", vocab_size=VOCAB)
    torch.manual_seed(1)
    source = ElectraPretrainingModel(cfg)
    export_hf(cfg, source.state_dict(), tmp_path / "pair")
    export_hf(cfg, {k[len("discriminator."):]: v for k, v in source.state_dict().items()
                    if k.startswith("discriminator.")}, tmp_path / "disc")
    assert not (tmp_path / "disc" / "generator").exists()
    assert transformers.AutoConfig.from_pretrained(tmp_path / "disc").architectures == ["ElectraForPreTraining"]
    want = source.state_dict()
    for name, fresh_generator in (("disc", True), ("pair", False)):
        weights = init_from.init_weights(tmp_path / name, tmp_path / "run", rank=0, vocab_size=(VOCAB, VOCAB))
        torch.manual_seed(2)
        target = ElectraPretrainingModel(cfg)
        said = load_init_weights(target, weights, tmp_path / name)
        assert ("ELECTRA generator: new" in said) == fresh_generator, said
        assert "put the generator's folder in the discriminator's as generator/" in said or not fresh_generator
        got = target.state_dict()
        for key in want:
            if key.startswith("discriminator.") or not fresh_generator:
                assert torch.equal(got[key], want[key]), (name, key)
    # a BERT-like model with an MLM head into the pair is still refused (it is not a discriminator)
    bert = PretrainingModel(get_preset("tiny", vocab_size=VOCAB), BERT_HEADS).state_dict()
    with pytest.raises(ValueError, match="the source lacks"):
        load_init_weights(ElectraPretrainingModel(cfg), bert, "SRC")


# ------------------------------------------------------------------------------------------- released tokenizers
def _text(en_corpus, tmp_path) -> tuple:
    """A few documents of the English test corpus (paragraphs are documents) and their lines."""
    data = en_corpus.read_text(encoding="utf-8")
    text = data[: data.index("\n\n", 20_000) + 2]
    path = tmp_path / "docs.txt"
    path.write_text(text, encoding="utf-8")
    return path, [line for line in text.splitlines() if line.strip()][:200]


def _bert_hub_folder(folder, lines, shuffle_seed=None):
    """bert-base-uncased's layout: config.json + weights + vocab.txt only (no tokenizer.json, no tokenizer_config)."""
    from collections import Counter
    words = Counter(w.strip(".,;:()'\"").lower() for line in lines for w in line.split())
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted({c for line in lines for c in line.lower() if not c.isspace()})
    vocab += chars + [f"##{c}" for c in chars] + [w for w, _ in words.most_common(150) if w and w not in chars]
    if shuffle_seed is not None:  # the same tokens, other ids: a vocabulary of the same size that is not this one
        import random
        body = vocab[8:]
        random.Random(shuffle_seed).shuffle(body)
        vocab = vocab[:8] + body
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(cfg).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return len(vocab)


def _roberta_hub_folder(folder, lines):
    """roberta's layout: config.json + weights + vocab.json + merges.txt."""
    import tokenizers
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    folder.mkdir(parents=True)
    bpe.save_model(str(folder))
    size = bpe.get_vocab_size()
    cfg = transformers.RobertaConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=66, pad_token_id=1)
    transformers.RobertaForMaskedLM(cfg).save_pretrained(folder)
    return size


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_released_tokenizer_converts_builds_a_corpus_and_passes_the_init_from_check(family, en_corpus, tmp_path):
    """`train_tokenizer.py --from-pretrained` turns the hub's tokenizer files into our folder (before: read_metadata
    refused any folder not written by train_tokenizer.py, so a corpus could not be made with bert-base-uncased's
    vocabulary); the ids are AutoTokenizer's on the original folder; build_indexed takes it; init_from of the model
    folder passes the token-by-token check, and a vocabulary of the same size with other ids is refused (before: only
    the size was compared, and the run trained on scrambled rows)."""
    from types import SimpleNamespace

    from data_prep import build_indexed, train_tokenizer
    from data_prep.tokenizer import load_tokenizer
    from trainer.init_from import corpus_tokenizer_dir

    docs, lines = _text(en_corpus, tmp_path)
    hub = tmp_path / "hub"
    size = (_bert_hub_folder if family == "bert" else _roberta_hub_folder)(hub, lines)
    assert train_tokenizer.main(["--from-pretrained", str(hub), "--output", str(tmp_path / "tok")]) == 0
    ours = load_tokenizer(tmp_path / "tok")
    assert (ours.kind, ours.lowercase, ours.vocab_size) == (("wordpiece", True, size) if family == "bert"
                                                             else ("bbpe", False, size))
    theirs = transformers.AutoTokenizer.from_pretrained(str(hub))
    assert [ours.encode(t) for t in lines] == [theirs.encode(t, add_special_tokens=False) for t in lines]
    assert (ours.pad_id, ours.cls_id, ours.mask_id) == (theirs.pad_token_id, theirs.cls_token_id,
                                                        theirs.mask_token_id)
    prefix = tmp_path / "corpus" / "train"
    assert build_indexed.main(["--input", str(docs), "--tokenizer", str(tmp_path / "tok"), "--output-prefix",
                               str(prefix)]) == 0
    corpus_tok = corpus_tokenizer_dir(SimpleNamespace(data=SimpleNamespace(corpora=[SimpleNamespace(prefix=prefix)])))
    assert corpus_tok is not None and corpus_tok.resolve() == (tmp_path / "tok").resolve()
    init_from.init_weights(hub, tmp_path / "run", rank=0, vocab_size=(size, size), tokenizer_dir=corpus_tok)
    if family == "bert":
        other = tmp_path / "other"
        assert _bert_hub_folder(other, lines, shuffle_seed=1) == size
        with pytest.raises(ValueError, match=r"its tokenizer is not the corpus tokenizer .*tokens have another id "
                                             r"or are missing \(first: id 8 .*--from-pretrained"):
            init_from.init_weights(other, tmp_path / "run", rank=0, vocab_size=(size, size), tokenizer_dir=corpus_tok)


def test_from_pretrained_refuses_what_it_cannot_use(tmp_path):
    from data_prep import train_tokenizer
    with pytest.raises(SystemExit, match="no tokenizer files"):
        train_tokenizer.main(["--from-pretrained", str(tmp_path), "--output", str(tmp_path / "tok")])
    with pytest.raises(SystemExit, match="--kind --vocab-size cannot be combined with --from-pretrained"):
        train_tokenizer.main(["--from-pretrained", str(tmp_path), "--kind", "bbpe", "--vocab-size", "100",
                              "--output", str(tmp_path / "tok")])


def test_a_hugging_face_trainer_checkpoint_folder_is_named_for_what_it_is(tmp_path):
    """An HF Trainer + DeepSpeed `checkpoint-500/` (config.json + model.safetensors beside DeepSpeed's `latest` and
    global_step500/) was refused as "not a Hugging Face folder (config.json)". Now the refusal says what it is and what
    to do, and doing it works. (The DeepSpeed state here is a stand-in file: the folder is refused before reading it.)"""
    import shutil
    folder = tmp_path / "checkpoint-500"
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=40)
    transformers.BertForMaskedLM(cfg).save_pretrained(folder)
    (folder / "latest").write_text("global_step500")
    (folder / "global_step500").mkdir()
    (folder / "global_step500" / "mp_rank_00_model_states.pt").write_bytes(b"")
    said = r"holds config\.json and Hugging Face weights beside a DeepSpeed checkpoint .*copy config\.json"
    with pytest.raises(FileNotFoundError, match=said):
        init_from.init_weights(folder, tmp_path / "run", rank=0)
    with pytest.raises(SourceError, match=said):
        load_source(folder)
    own = tmp_path / "model"
    own.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(folder / name, own / name)
    assert "encoder.embeddings.word.weight" in init_from.init_weights(own, tmp_path / "run", rank=0)


def test_source_settings_that_are_not_shapes_must_be_the_runs(tmp_path):
    """hidden_act / layer_norm_eps / pad_token_id / position_offset of the source were replaced by model.*'s without a
    word (ernie-1.0-base-zh, relu and eps 1e-5, continued as gelu and 1e-12); now they must match."""
    from trainer.models.hf_convert import config_from_hf
    folder, _ = _bert_folder(tmp_path, "relu", hidden_act="relu", layer_norm_eps=1e-5)
    ours = config_from_hf(transformers.AutoConfig.from_pretrained(folder))
    with pytest.raises(ValueError, match=r"other model settings \(hidden_act 'relu' there, 'gelu' here, layer_norm_eps "
                                         r"1e-05 there, 1e-12 here\).*--set model\.hidden_act=relu --set "
                                         r"model\.layer_norm_eps=1e-05"):
        init_from.init_weights(folder, tmp_path / "run", rank=0,
                               model_cfg=ours.replace(hidden_act="gelu", layer_norm_eps=1e-12))
    init_from.init_weights(folder, tmp_path / "run", rank=0, model_cfg=ours)
