"""ERNIE side-cars are keyed on their shard's content (``bin_sha256``), not only its token counts; jieba's options
(``jieba:hmm=off``, ``jieba:userdict=PATH``) and the traditional-text warning.

The stale case a reviewer found: a corpus annotated from traditional text, rebuilt from the same text converted to
simplified (one character for one: same token counts, other ids) without --annotate, then annotated again: the old
side-cars were kept ("annotated 0 shard(s)") and the trainer masked with spans of the old text."""
import json
from pathlib import Path

import numpy as np
import pytest

from data_prep import annotate, build_indexed, sidecar
from data_prep import manifest as mf

# simplified -> traditional, one character for one (what OpenCC s2t does to these sentences)
S2T = dict(zip("们这个国说时来会学为与发后经过现开关动进种产实将点还体从问应当长业机线见书东车马门电话语读写听买卖钱银难欢乐价",
               "們這個國說時來會學為與發後經過現開關動進種產實將點還體從問應當長業機線見書東車馬門電話語讀寫聽買賣錢銀難歡樂價"))
SENTENCES = ["我们这个国家的学生都会说中文。", "他们现在开车去东门买书。", "这种产品的实际价格还是很难说。",
             "经过一段时间的学习，我们的汉语水平提高了。", "银行门口有很多人在听音乐。", "从东边来的马车将要进门了。"]


def _text(traditional: bool, docs: int = 120) -> str:
    conv = (lambda s: "".join(S2T.get(c, c) for c in s)) if traditional else (lambda s: s)
    return "".join(f"{conv(SENTENCES[d % 6])}\n{conv(SENTENCES[(d * 5 + 1) % 6])}\n\n" for d in range(docs))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A zh tokenizer (one token per Han character) that knows both forms of every character above."""
    from data_prep import train_tokenizer

    tmp = tmp_path_factory.mktemp("keys_tok")
    (tmp / "v.txt").write_text((_text(False, 6) + _text(True, 6)) * 5, encoding="utf-8")
    assert train_tokenizer.main(["--kind", "zh", "--input", str(tmp / "v.txt"), "--output", str(tmp / "tok"),
                                 "--vocab-size", "400", "--quiet"]) == 0
    return str(tmp / "tok")


def _build(src: Path, tok: str, prefix: Path, *extra) -> int:
    return build_indexed.main(["--input", str(src), "--tokenizer", tok, "--output-prefix", str(prefix),
                               "--chunk-size-mb", "0.004", *extra])


def _spans(prefix: Path) -> list:
    return [np.load(f"{prefix}_{i:05d}.spans.npy").tolist() for i in range(len(mf.read_manifest(prefix)["shards"]))]


def _corpus_spans(prefix: Path, cache: Path):
    from trainer.data.cache_file import CachePolicy
    from trainer.data.corpus import IndexedCorpus
    from trainer.ernie.sidecars import CorpusSpans

    return CorpusSpans(IndexedCorpus(prefix, CachePolicy(cache)))


@pytest.fixture
def rebuilt(tok, tmp_path, capsys):
    """Annotated from traditional text, then rebuilt from simplified without --annotate: the old side-cars stay."""
    src = tmp_path / "zh.txt"
    src.write_text(_text(True, 70), encoding="utf-8")
    prefix = tmp_path / "c" / "zh"
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    old = _spans(prefix)
    old_shards = mf.read_manifest(prefix)["shards"]
    src.write_text(_text(False, 70), encoding="utf-8")
    assert _build(src, tok, prefix) == 0
    new_shards = mf.read_manifest(prefix)["shards"]
    assert len(new_shards) == len(old_shards) >= 2
    assert [s["sentences"] for s in new_shards] == [s["sentences"] for s in old_shards]
    assert all(s.get("sidecar") is None for s in new_shards)
    assert [s["bin_sha256"] for s in new_shards] != [s["bin_sha256"] for s in old_shards]
    capsys.readouterr()
    return src, prefix, old, len(new_shards)


def test_rerunning_annotate_after_a_rebuild_annotates_the_new_text_again(rebuilt, tok, tmp_path, capsys):
    src, prefix, old, n = rebuilt
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    out = capsys.readouterr().out
    assert f"annotated {n} shard(s) with jieba" in out  # was: "annotated 0 shard(s)", the old spans kept
    assert f"note: {n} side-car(s) made by jieba from other shard content" in out
    assert _spans(prefix) != old
    fresh = tmp_path / "fresh" / "zh"  # the same text annotated from scratch: the very same spans
    assert _build(src, tok, fresh, "--annotate", "jieba") == 0
    assert _spans(prefix) == _spans(fresh)
    for shard in mf.read_manifest(prefix)["shards"]:
        header = json.loads((prefix.parent / (shard["prefix"] + ".spans.json")).read_text())
        assert header["bin_sha256"] == shard["bin_sha256"]


def test_the_trainer_refuses_a_side_car_made_from_the_old_text(rebuilt, tmp_path):
    _, prefix, _, _ = rebuilt
    with pytest.raises(ValueError, match=r"zh_00000\.spans\.json cannot be used.*rebuilt after it was annotated.*"
                                         r"python -m data_prep\.annotate .*zh --annotate jieba"):
        _corpus_spans(prefix, tmp_path / "cache")


def _unkey(prefix: Path, n: int) -> None:
    """What the code before 2026-12-06 wrote: the same header without ``bin_sha256``."""
    for i in range(n):
        js = Path(f"{prefix}_{i:05d}.spans.json")
        header = json.loads(js.read_text())
        del header["bin_sha256"]
        js.write_text(json.dumps(header))


def test_an_old_stale_side_car_is_found_by_the_spot_check_and_annotated_again(rebuilt, tok, capsys):
    src, prefix, old, n = rebuilt
    _unkey(prefix, n)
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    out = capsys.readouterr().out
    assert f"annotated {n} shard(s) with jieba" in out and f"note: {n} side-car(s)" in out
    assert _spans(prefix) != old


def test_an_old_valid_side_car_is_refused_by_the_trainer_until_keyed_in_place(tok, tmp_path, capsys):
    src = tmp_path / "zh.txt"
    src.write_text(_text(False), encoding="utf-8")
    prefix = tmp_path / "c" / "zh"
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    n = len(mf.read_manifest(prefix)["shards"])
    _unkey(prefix, n)
    with pytest.raises(ValueError, match=r"no shard checksum.*--annotate jieba --keep-complete"):
        _corpus_spans(prefix, tmp_path / "cache")
    before = {i: Path(f"{prefix}_{i:05d}.spans.npy").stat().st_mtime_ns for i in range(n)}
    spans = _spans(prefix)
    capsys.readouterr()
    assert annotate.main([str(prefix), "--annotate", "jieba", "--keep-complete", "--quiet"]) == 0
    assert f"{n} of {n} shard(s) already have a complete side-car from jieba ({n} older one(s) spot-checked" \
        in capsys.readouterr().out
    assert {i: Path(f"{prefix}_{i:05d}.spans.npy").stat().st_mtime_ns for i in range(n)} == before  # not redone
    assert _spans(prefix) == spans
    assert int(_corpus_spans(prefix, tmp_path / "cache").starts[-1]) > 0  # accepted now


def test_another_jieba_option_annotates_again(tok, tmp_path):
    src = tmp_path / "zh.txt"
    src.write_text(_text(False, 40), encoding="utf-8")
    prefix = tmp_path / "c" / "zh"
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    n = len(mf.read_manifest(prefix)["shards"])
    assert len(annotate.complete_sidecars(prefix, "jieba")) == n
    assert annotate.complete_sidecars(prefix, "jieba:hmm=off") == {}
    assert _build(src, tok, prefix, "--annotate", "jieba:hmm=off") == 0
    assert all(s["sidecar"]["annotator"] == "jieba:hmm=off" for s in mf.read_manifest(prefix)["shards"])


def test_jieba_options_hmm_off_and_a_user_dictionary(tok, tmp_path, capsys):
    from data_prep.annotators import make_annotator

    text = "王军虎去了李小福的网易杭研大厦"  # names jieba's dictionary lacks: its HMM finds them
    entities = lambda spec: [text[s:e] for s, e, k in make_annotator(spec)(text) if k == sidecar.ENTITY]  # noqa
    assert entities("jieba")[:2] == ["王军虎", "李小福"]
    assert "王军虎" not in entities("jieba:hmm=off") and "李小福" not in entities("jieba:hmm=off")
    user = tmp_path / "names.txt"
    user.write_text("杭研大厦 5 nt\n", encoding="utf-8")
    assert "杭研大厦" in entities(f"jieba:hmm=off,userdict={user}")  # the user's word, tagged an organisation
    with pytest.raises(ValueError, match=r"jieba option 'hmm=maybe' is not hmm=on, hmm=off or userdict=PATH"):
        make_annotator("jieba:hmm=maybe")
    with pytest.raises(FileNotFoundError, match=r"jieba user dictionary .*nope.txt not found"):
        make_annotator(f"jieba:userdict={tmp_path / 'nope.txt'}")
    assert _build(user, tok, tmp_path / "x", "--annotate", "jieba:hmm=of") == 2  # before any tokenizing
    assert "jieba option 'hmm=of'" in capsys.readouterr().err and not (tmp_path / "x.manifest.json").exists()


def test_a_largely_traditional_shard_is_warned_about_with_counts(tok, tmp_path, capsys):
    for traditional in (True, False):
        src = tmp_path / f"{traditional}.txt"
        src.write_text(_text(traditional, 80), encoding="utf-8")
        prefix = tmp_path / str(traditional) / "zh"
        assert build_indexed.main(["--input", str(src), "--tokenizer", tok, "--output-prefix", str(prefix),
                                   "--annotate", "jieba"]) == 0
        err, out = capsys.readouterr()[::-1]
        (shard,) = mf.read_manifest(prefix)["shards"]
        stats = json.loads((prefix.parent / (shard["prefix"] + ".spans.json")).read_text())["stats"]
        assert stats["cjk_chars"] > 2000
        if traditional:
            assert stats["traditional_chars"] > 0.1 * stats["cjk_chars"]
            assert "CJK characters" in err and "traditional-only forms" in err and "OpenCC t2s" in err
            assert "1 shard(s) are largely traditional Chinese" in out
        else:
            assert stats["traditional_chars"] == 0
            assert "traditional-only" not in err and "largely traditional" not in out


def test_a_side_car_cache_entry_of_the_older_code_does_not_let_an_unkeyed_side_car_through(tok, tmp_path,
                                                                                           monkeypatch):
    """The side-car check runs when the cache entry is built; the older code's entry (version 2, built without the
    content check) was a hit for the same manifest, so an unkeyed side-car passed start-up and failed in a loader
    worker at the first batch, after the model and DeepSpeed were up (found by the diff review). Version 3: the older
    entry is not read; the check refuses at start. The older entry is made here by the check as the older code ran it
    (check_content a no-op, version 2)."""
    from trainer.ernie import sidecars

    src = tmp_path / "zh.txt"
    src.write_text(_text(False), encoding="utf-8")
    prefix = tmp_path / "c" / "zh"
    assert _build(src, tok, prefix, "--annotate", "jieba") == 0
    _unkey(prefix, len(mf.read_manifest(prefix)["shards"]))
    with monkeypatch.context() as m:
        m.setattr(sidecars, "SIDECAR_CACHE_VERSION", 2)
        m.setattr(sidecars, "check_content", lambda *a: None)
        _corpus_spans(prefix, tmp_path / "cache")  # the older code's entry
    assert len(list((tmp_path / "cache").glob("sidecars-*.bfc"))) == 1
    with pytest.raises(ValueError, match=r"no shard checksum.*--keep-complete"):
        _corpus_spans(prefix, tmp_path / "cache")


def test_a_rank_that_cannot_read_its_jieba_dictionary_says_so_through_the_gather(tok, tmp_path):
    """Under MPI every rank annotates its share; a rank whose jieba:userdict is missing on its node raised before the
    gather and exited while the other ranks waited in it (a hang under srun; found by the diff review). It now
    reaches the gather with its error, which every rank raises. The gather here is a stand-in for mpi4py's (the
    other rank answered ok): tests/test_annotate_mpi.py runs the real one."""
    src = tmp_path / "zh.txt"
    src.write_text(_text(False, 20), encoding="utf-8")
    prefix = tmp_path / "c" / "zh"
    assert _build(src, tok, prefix) == 0
    gathered = []

    def allgather(obj):
        gathered.append(obj)
        return [("ok", {}, {}, {}), obj]

    with pytest.raises(ValueError, match=r"annotation failed on rank 1: .*nope\.txt"):
        annotate.annotate_corpus(prefix, f"jieba:userdict={tmp_path / 'nope.txt'}", workers=1, progress=False,
                                 rank=1, size=2, allgather=allgather)
    assert len(gathered) == 1 and gathered[0][0].startswith("rank 1: ")
