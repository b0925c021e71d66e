"""ERNIE side-car spans: annotators on hand-checked text, alignment to tokens, the side-car's round trip on the shared
Chinese corpus."""
import json
from pathlib import Path

import numpy as np
import pytest

from data_prep import annotate, annotators, sidecar
from data_prep.sidecar import ENTITY, PHRASE


def _zh_tokenizer_dir(tmp: Path, corpus: Path) -> Path:
    """A small `zh` tokenizer folder (one token per Han character, WordPiece for the rest) from data prep's trainer."""
    from data_prep import train_tokenizer

    out = tmp / "zh_tok"
    # the whole corpus (0.6 MB, ~1 s): these tests encode its first lines and need every character to have a token;
    # a --limit-bytes sample is spread over the corpus and leaves some of them [UNK]
    train_tokenizer.main(["--kind", "zh", "--input", str(corpus), "--output", str(out), "--vocab-size", "2900",
                          "--quiet"])
    return out


@pytest.fixture(scope="module")
def zh_tok(tmp_path_factory, zh_corpus):
    return _zh_tokenizer_dir(tmp_path_factory.mktemp("tok"), zh_corpus)


def _texts(text, spans, kind):
    return [text[s:e] for s, e, k in spans if k == kind]


def test_jieba_entities_from_pos_tags_and_phrases_from_word_groups():
    text = "李小龙在北京大学学习，后来去了美国的谷歌公司工作。"
    spans = annotators.make_annotator("jieba")(text)
    assert {"李小龙", "北京大学", "美国"} <= set(_texts(text, spans, ENTITY))
    phrases = _texts(text, spans, PHRASE)
    assert "谷歌公司" in phrases          # two adjacent nouns chained into one phrase
    assert "学习" in phrases               # a multi-character word on its own
    assert not any(p in ("在", "，", "的", "。") for p in phrases)
    assert spans == sorted(spans)


def test_gazetteer_leftmost_longest_with_kinds(tmp_path):
    gaz = tmp_path / "gaz.txt"
    gaz.write_text("# titles\n北京\n北京大学\nNew York\tentity\nmachine learning\tphrase\n\n", encoding="utf-8")
    ann = annotators.make_annotator(f"gazetteer:{gaz}")
    text = "我在北京大学学 machine learning, then New York."
    spans = ann(text)
    assert [(text[s:e], k) for s, e, k in spans] == [("北京大学", ENTITY), ("machine learning", PHRASE),
                                                      ("New York", ENTITY)]


def test_gazetteer_bad_kind_names_file_and_line(tmp_path):
    gaz = tmp_path / "gaz.txt"
    gaz.write_text("北京\nfoo\tperson\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"gaz.txt:2: kind 'person'"):
        annotators.make_annotator(f"gazetteer:{gaz}")


def test_jsonl_spans_matched_by_text_and_bad_record_reported(tmp_path):
    good = tmp_path / "ner.jsonl"
    good.write_text(json.dumps({"text": "李小龙在北京", "spans": [[0, 3, "entity"], [4, 6, "entity"]]},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    ann = annotators.make_annotator(f"jsonl:{good}")
    assert ann("李小龙在北京") == [(0, 3, ENTITY), (4, 6, ENTITY)]
    assert ann("别的句子") == [] and ann.misses == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "abc", "spans": [[0, 9, "entity"]]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: span"):
        annotators.make_annotator(f"jsonl:{bad}")
    with pytest.raises(ValueError, match="expected jieba, gazetteer:FILE"):
        annotators.make_annotator("spacy")


def test_align_spans_keeps_only_token_boundaries():
    # "北京 York": tokens 北 | 京 | York ; "Yo" (3, 5) does not end on a token boundary.
    offsets = np.array([[0, 1], [1, 2], [3, 7]])
    spans, dropped = annotators.align_spans([(0, 2, ENTITY), (3, 5, ENTITY), (3, 7, PHRASE), (1, 7, PHRASE)], offsets)
    assert spans.tolist() == [[0, 2, ENTITY], [2, 3, PHRASE], [1, 3, PHRASE]]
    assert dropped == 1


def test_sidecar_round_trip_on_chinese_corpus(tmp_path, zh_tok, zh_corpus):
    from tokenizers import Tokenizer

    from data_prep.tokenizer import load_tokenizer

    hf = Tokenizer.from_file(str(zh_tok / "tokenizer.json"))
    ours = load_tokenizer(zh_tok)  # what build_indexed writes to the shards
    lines = [l for l in zh_corpus.read_text(encoding="utf-8").splitlines()[:600]]
    docs, doc = [], []
    for line in lines:  # the corpus's layout: a blank line between documents
        if line.strip():
            doc.append(line)
        elif doc:
            docs.append(doc)
            doc = []
    ids = [ours.encode_batch(d) for d in docs]
    doc = annotators.DocumentAnnotator(annotators.make_annotator("jieba"), zh_tok)
    writer = sidecar.SidecarWriter(tmp_path / "zh_00000", doc)
    expected = []
    for d, d_ids in zip(docs, ids):
        writer.add_document(d, d_ids)
    header = writer.finalize()
    n_seq = sum(len(d) for d in docs)
    assert header["sequences"] == n_seq and header["spans"] > n_seq  # several spans per sentence on average
    assert header["stats"]["entity"] > 0 and header["stats"]["phrase"] > 0

    reader = sidecar.SidecarReader(tmp_path / "zh_00000", expect_sequences=n_seq)
    flat_text = [s for d in docs for s in d]
    flat_ids = [x for d in ids for x in d]
    annot = annotators.make_annotator("jieba")
    checked = 0
    for seq in range(n_seq):
        spans = reader[seq]
        # every stored span covers exactly the characters jieba marked: decode its tokens and compare
        chars = {(flat_text[seq][s:e], k) for s, e, k in annot(flat_text[seq])}
        enc = hf.encode(flat_text[seq], add_special_tokens=False)
        for s, e, k in spans.tolist():
            assert 0 <= s < e <= len(flat_ids[seq])
            text = flat_text[seq][enc.offsets[s][0]:enc.offsets[e - 1][1]]
            assert (text, k) in chars
            checked += 1
    assert checked == header["spans"]
    rng = reader.range(3, 9)
    assert np.all((rng[:, 0] >= 3) & (rng[:, 0] < 9))
    assert np.array_equal(rng[rng[:, 0] == 5, 1:], reader[5])
    for seq in range(n_seq):  # one kind never overlaps itself
        for kind in (ENTITY, PHRASE):
            s = reader[seq][reader[seq][:, 2] == kind]
            assert np.all(s[1:, 0] >= s[:-1, 1])


def test_sidecar_refuses_wrong_build(tmp_path, zh_tok):
    doc = annotators.DocumentAnnotator(annotators.make_annotator("jieba"), zh_tok)
    writer = sidecar.SidecarWriter(tmp_path / "s", doc)
    with pytest.raises(ValueError, match="differs from the ids written"):
        writer.add_document(["北京大学"], [[1, 2, 3, 4, 5]])
    writer.add_document(["北京大学很大。"])
    writer.finalize()
    with pytest.raises(ValueError, match="covers 1 sequences but the shard has 2"):
        sidecar.SidecarReader(tmp_path / "s", expect_sequences=2)
    with pytest.raises(FileNotFoundError, match="--annotate"):
        sidecar.SidecarReader(tmp_path / "missing")


def _shard(prefix, lengths):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for n in lengths:
        builder.add_document(torch.arange(5, 5 + n), [n])
    builder.finalize(f"{prefix}.idx")


def test_sidecar_refuses_a_shard_rebuilt_with_other_tokens(tmp_path):
    """Same sentence count, other token counts (a shard rebuilt with another tokenizer after it was annotated): the
    side-car's spans would point at other tokens, so the reader refuses it; the lengths come from the .idx."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = tmp_path / "s_00000"
    _shard(prefix, [4, 6, 3])
    assert sidecar.shard_sequence_lengths(prefix).tolist() == IndexedDataset(str(prefix)).sequence_lengths.tolist()
    writer = sidecar.SidecarWriter(prefix, spec="gazetteer:x")
    writer.add_document_spans([np.array([[0, 2, ENTITY]]), np.zeros((0, 3)), np.array([[1, 3, PHRASE]])], [4, 6, 3])
    assert "lengths_sha256" in writer.finalize()
    assert len(sidecar.SidecarReader(prefix, expect_sequences=3)) == 3
    _shard(prefix, [5, 6, 3])
    with pytest.raises(ValueError, match="other tokens than .*s_00000.bin"):
        sidecar.SidecarReader(prefix, expect_sequences=3)
    # without the lengths (older side-cars, or spans added without them) there is nothing to compare
    writer = sidecar.SidecarWriter(prefix, spec="gazetteer:x")
    writer.add_document_spans([np.zeros((0, 3))] * 3)
    assert "lengths_sha256" not in writer.finalize()
    assert len(sidecar.SidecarReader(prefix, expect_sequences=3)) == 3


def test_place_spans_into_sample_and_drop_truncated():
    a = np.array([[0, 2, ENTITY], [3, 5, PHRASE]])
    b = np.array([[1, 4, ENTITY]])
    # [CLS] a(5 tokens) [SEP] b(truncated to 3 tokens) [SEP]
    placed = sidecar.place_spans([a, b], starts=[1, 7], lengths=[5, 3])
    assert placed.tolist() == [[1, 3, ENTITY], [4, 6, PHRASE]]


@pytest.mark.parametrize("kind", ["zh", "wordpiece", "bbpe"])
def test_sequence_text_rebuilds_text_that_tokenizes_back(tmp_path, kind, zh_corpus, en_corpus):
    """Offline annotation reads text rebuilt from shard tokens: re-encoding it must give the same ids, and each
    token's offsets must cover its own characters."""
    from data_prep import train_tokenizer
    from data_prep.tokenizer import load_tokenizer

    corpus = zh_corpus if kind == "zh" else en_corpus
    out = tmp_path / kind
    # zh: the whole corpus, so that every character of the lines below has a token ([UNK] does not re-encode)
    limit = [] if kind == "zh" else ["--limit-bytes", "200K"]
    train_tokenizer.main(["--kind", kind, "--input", str(corpus), "--output", str(out), "--vocab-size", "2000",
                          "--quiet", *limit])
    tok = load_tokenizer(out)
    lines = [l for l in corpus.read_text(encoding="utf-8").splitlines()[:400] if l.strip()]
    to_text = annotate.SequenceText(tok)
    differ = []
    for line, ids in zip(lines, tok.encode_batch(lines)):
        text, offsets = to_text(ids)
        assert len(offsets) == len(ids) and np.all(offsets[:, 0] <= offsets[:, 1])
        assert np.all(np.diff(offsets[:, 0]) >= 0)
        if tok.encode(text) != ids:
            differ.append((line, text))
    # every one re-encodes (measured 2026-12-04: 305/305 zh, 391/391 wordpiece and bbpe lines)
    assert not differ, f"{kind}: {len(differ)}/{len(lines)} sequences do not re-encode to their ids, e.g. {differ[:2]}"


@pytest.mark.slow
def test_annotate_existing_corpus_matches_in_build_annotation(tmp_path, zh_tok, zh_corpus):
    """`python -m data_prep.annotate PREFIX --annotate jieba` on shards from build_indexed.py gives the side-car
    the in-build hook gives from the original text, span for span. (The zh tokenizer lower-cases, so Latin words
    could differ between the two; its first 800 lines have none, and all 2,226 spans agree.)"""
    from data_prep import build_indexed
    from data_prep.tokenizer import load_tokenizer

    text = tmp_path / "zh.txt"
    text.write_text("\n".join(zh_corpus.read_text(encoding="utf-8").splitlines()[:800]) + "\n", encoding="utf-8")
    prefix = tmp_path / "corpus" / "zh"
    assert build_indexed.main(["--input", str(text), "--tokenizer", str(zh_tok), "--output-prefix", str(prefix)]) == 0
    assert annotate.main([str(prefix), "--annotate", "jieba", "--quiet"]) == 0
    offline = sidecar.SidecarReader(str(prefix) + "_00000")
    # the manifest records the side-car it wrote (the trainer keys its check by it and reads no header at start-up)
    from data_prep.manifest import read_manifest
    (shard,) = read_manifest(prefix)["shards"]
    assert shard["sidecar"] == sidecar.header_record(offline.header) and shard["sidecar"]["annotator"] == "jieba"
    assert shard["sidecar"]["lengths_sha256"] and shard["sidecar"]["spans"] == len(offline.spans)

    # the hook's view: documents as build_indexed reads them (blank line between documents), original text
    tok = load_tokenizer(zh_tok)
    doc = annotators.DocumentAnnotator(annotators.make_annotator("jieba"), zh_tok)
    writer = sidecar.SidecarWriter(tmp_path / "hook", doc)
    doc = []
    for line in text.read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip():
            doc.append(line)
        elif doc:
            writer.add_document(doc, tok.encode_batch(doc))
            doc = []
    writer.finalize()
    hook = sidecar.SidecarReader(tmp_path / "hook", expect_sequences=len(offline))
    a = {tuple(r) for r in np.asarray(offline.spans).tolist()}
    b = {tuple(r) for r in np.asarray(hook.spans).tolist()}
    assert len(a) > 1000
    assert a == b, (f"{len(a ^ b)} of {len(a | b)} spans differ, e.g. offline only {sorted(a - b)[:5]}, "
                    f"hook only {sorted(b - a)[:5]}")


def test_names_moved_out_of_annotate_still_import_from_it():
    """annotators.py and sidecar.py were split out of annotate.py: callers that use annotate.X keep working."""
    for module, names in ((annotators, ("Annotator", "JiebaAnnotator", "GazetteerAnnotator", "JsonlAnnotator",
                                        "make_annotator", "align_spans", "DocumentAnnotator", "CharSpan")),
                          (sidecar, ("KINDS", "ENTITY", "PHRASE", "FORMAT", "VERSION", "SidecarWriter",
                                     "SidecarReader", "place_spans"))):
        for name in names:
            assert getattr(annotate, name) is getattr(module, name), name


def test_jieba_without_a_writable_cache_folder_warns_and_annotates(tmp_path, monkeypatch, capsys):
    """The keyed jieba cache is a ~1 s speed-up: a HOME where ~/.cache cannot be created (here a file, so that root
    cannot write it either; a read-only HOME fails the same mkdir) gives one warning and a private temporary folder,
    not an OSError after the corpus was tokenized (review F5). What this cannot see: a HOME that is really
    read-only for a non-root user (the same mkdir, another errno)."""
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("BERTFAMILY_CACHE", raising=False)
    monkeypatch.setattr(annotators, "_JIEBA_FOLDER", [], raising=False)
    spans = annotators.make_annotator("jieba")("北京大学的学生在上海工作。")
    assert spans
    err = capsys.readouterr().err
    assert err.count("warning: jieba's dictionary cache folder cannot be created") == 1
    assert "BERTFAMILY_CACHE" in err
