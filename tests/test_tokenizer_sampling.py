"""``train_tokenizer.py --limit-bytes``: a sample spread over the whole of every input in proportion to its text
(data_prep/sample_text.py), and SentencePiece's text capped in bytes. Split from test_tokenizers.py, which tests the
tokenizer folders themselves."""
import gzip
import json
import re

import pytest

from data_prep import train_tokenizer
from data_prep.tokenizer import META_FILE, load_tokenizer
from test_tokenizers import _read_slice


def test_limit_bytes_is_shared_across_inputs(tmp_path, en_corpus, zh_corpus):
    """A budget smaller than the first input still reaches the second one (each gets its share by size)."""
    out = tmp_path / "both"
    assert train_tokenizer.main(["--kind", "zh", "--input", str(en_corpus), str(zh_corpus), "--output", str(out),
                                 "--vocab-size", "1500", "--limit-bytes", "400K", "--quiet"]) == 0
    meta = json.loads((out / META_FILE).read_text())["training"]
    assert meta["truncated_at_limit"] and meta["bytes"] <= 400 * 1024
    tok = load_tokenizer(out)
    han = re.findall(r"[\u4e00-\u9fff]", _read_slice(zh_corpus, 20_000))
    # the sample is spread over the whole zh input (not its head): its rarer characters may be left out
    assert tok.encode("".join(han)).count(tok.unk_id) < 0.1 * len(han)
    assert tok.encode("the") != [tok.unk_id]


def _docs(n, word):
    return "".join(f"{word} number {i} is here. It has a second sentence.\n\n" for i in range(n))


def _sample(paths, limit, **kw):
    feed = train_tokenizer.LineFeed([str(p) for p in paths], limit_bytes=limit, progress=False, **kw)
    return feed, list(feed)


def test_limit_bytes_samples_the_whole_of_a_single_file(tmp_path):
    """One file of English then Chinese (a concatenated dump): a budget of a fifth of it used to be its head, all
    English, and a zh tokenizer trained on it had 0 Han tokens. The sample now comes from every part of the file."""
    f = tmp_path / "one.txt"
    f.write_text(_docs(20000, "alpha") + "".join(f"第{i}号文档。这是中文。\n\n" for i in range(20000)),
                 encoding="utf-8")
    limit = f.stat().st_size // 5
    feed, lines = _sample([f], limit)
    assert feed.truncated and 0.95 * limit <= feed.bytes <= limit
    han = [line for line in lines if "中文" in line]
    assert 0.3 < sum(len(x.encode()) for x in han) / feed.bytes < 0.5  # the Chinese half is ~40 % of the bytes
    numbers = [int(re.search(r"\d+", x).group()) for x in han]
    assert min(numbers) < 1000 and max(numbers) > 19000  # from its start to its end, not one stretch
    out = tmp_path / "zh"
    assert train_tokenizer.main(["--kind", "zh", "--input", str(f), "--output", str(out), "--vocab-size", "300",
                                 "--limit-bytes", str(limit), "--quiet"]) == 0
    tok = load_tokenizer(out)
    assert tok.unk_id not in tok.encode("这是中文") and tok.unk_id not in tok.encode("alpha")


def test_limit_bytes_gives_a_compressed_input_the_share_of_its_text(tmp_path):
    """Two inputs of the same text size, one gzipped: each gets about half (the share used to follow the size on
    disk, 4 % here for this very compressible text)."""
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_text(_docs(20000, "alpha"))
    with gzip.open(packed, "wt") as fh:
        fh.write(_docs(20000, "beta"))
    feed, lines = _sample([plain, packed], 400_000)
    share = sum(len(x.encode()) for x in lines if x.startswith("beta")) / feed.bytes
    assert 0.45 < share < 0.55, f"the compressed input got {share:.0%} of the sample"
    beta = [int(x.split()[2]) for x in lines if x.startswith("beta")]
    assert min(beta) < 1000 and max(beta) > 19000  # spread over the whole stream too


def test_limit_bytes_fills_its_budget_from_many_small_files(tmp_path):
    """2,000 small files, a budget of a quarter of their text: each file's share is shorter than its first line, so
    almost nothing was read ("no text read"). Unused shares pass on: the budget is used, at an even stride."""
    for i in range(2000):
        (tmp_path / f"f{i:04d}.txt").write_text(("word " * (5 + i % 40)).strip() + ".\nSecond line here.\n")
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    feed, _ = _sample([tmp_path], total // 4)
    assert 0.9 * (total // 4) <= feed.bytes <= total // 4
    used = [i for i, share in enumerate(feed.shares) if share.taken]
    assert len(used) > 400 and used[0] < 20 and used[-1] > 1980
    assert feed.documents == len(used)  # counts documents that gave text, not every one opened


def test_limit_bytes_sample_is_deterministic_and_logged_per_kind(tmp_path, capsys):
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.txt.gz"
    plain.write_text("".join(json.dumps({"text": f"record {i} says hello.\nAnd more."}) + "\n" for i in range(5000)))
    with gzip.open(packed, "wt") as fh:
        fh.write(_docs(5000, "beta"))
    _, first = _sample([plain, packed], 100_000)
    _, second = _sample([plain, packed], 100_000)
    assert first == second
    assert train_tokenizer.main(["--kind", "bbpe", "--input", str(plain), str(packed), "--output",
                                 str(tmp_path / "tok"), "--vocab-size", "300", "--limit-bytes", "100K"]) == 0
    log = capsys.readouterr().out
    assert re.search(r"MB of \d.*\(\d+%\) from 1 plain input", log), log
    assert re.search(r"MB of ~\d.*\(\d+%\) from 1 compressed input", log), log


def test_unigram_text_is_capped_in_bytes_and_its_memory_announced(tmp_path, en_corpus, capsys):
    """SentencePiece holds its text in memory at ~22x (44 GB at 2G of text); --spm-sentences bounds lines, and 10M
    paragraph lines are GBs. --spm-max-bytes caps the text (sampled over the inputs) and the run says what to
    expect before it starts."""
    corpus = tmp_path / "en.txt"
    corpus.write_text(_read_slice(en_corpus, 300_000), encoding="utf-8")
    out = tmp_path / "uni"
    assert train_tokenizer.main(["--kind", "unigram", "--input", str(corpus), "--output", str(out), "--vocab-size",
                                 "400", "--spm-max-bytes", "100K", "--quiet"]) == 0
    meta = json.loads((out / META_FILE).read_text())["training"]
    assert meta["truncated_at_limit"] and 90 * 1024 <= meta["bytes"] <= 100 * 1024
    log = capsys.readouterr().out
    assert re.search(r"up to 0\.1 MB of text, expect ~0\.0 GB of RAM", log), log
    assert log.index("expect ~") < log.index("unigram tokenizer:")  # said before training, not after
    assert "--spm-max-bytes 102,400: sampled across each input" in log  # the cap that made it a sample


def test_limit_bytes_windows_of_wikiextractor_output_start_at_a_doc_tag(tmp_path):
    """A window that started inside a <doc> block would drop the block's lines as text_outside_doc: windows of
    WikiExtractor output start at <doc ...> lines, so the sample holds article text only, from every part."""
    (tmp_path / "AA").mkdir()
    (tmp_path / "AA" / "wiki_00").write_text("".join(
        f'<doc id="{i}" url="https://x/?curid={i}" title="Title {i}">\nTitle {i}\n\n'
        + "".join(f"Article {i} paragraph {j} says something long enough.\n" for j in range(8)) + "\n</doc>\n"
        for i in range(2000)), encoding="utf-8")
    feed, lines = _sample([tmp_path], 60_000)
    assert 0.9 * 60_000 <= feed.bytes <= 60_000
    assert not feed.skipped, feed.skipped
    assert not any(x.startswith(("<doc", "</doc")) for x in lines)
    ids = {int(x.split()[1]) for x in lines if x.startswith("Article")}
    assert min(ids) < 100 and max(ids) > 1800  # 15 windows: the last starts at 14/15 of the file


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".zst"])
def test_compressed_input_size_is_estimated_uncompressed(tmp_path, monkeypatch, suffix):
    """A compressed input's share follows its uncompressed text: exact when the stream fits in the probe, within a
    few percent from the probe's ratio otherwise (the probe is made small here to test the second case)."""
    import bz2
    import random

    import zstandard

    from data_prep import sample_text

    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    text = "".join(" ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(20000)).encode()
    path = tmp_path / f"c.txt{suffix}"
    pack = {".gz": gzip.compress, ".bz2": bz2.compress, ".zst": zstandard.ZstdCompressor().compress}[suffix]
    path.write_bytes(pack(text[:50_000]) + pack(text[50_000:]))  # two members / streams / frames, as cat makes
    assert sample_text.estimate_uncompressed(str(path)) == len(text)
    monkeypatch.setattr(sample_text, "PROBE_BYTES", 200_000)
    assert abs(sample_text.estimate_uncompressed(str(path)) / len(text) - 1) < 0.1
