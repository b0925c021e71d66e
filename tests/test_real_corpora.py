"""Corpora as they come (review "corpora", findings 2, 6, 7, 8, 10): WikiExtractor folders, files in another
encoding, runs that would build from a fraction of their input, JSON arrays, BOMs of concatenated files, CR-only
line ends. Small generated inputs; one tiny byte-level tokenizer for the build_indexed runs."""
import json
import os
from collections import Counter

import pytest

from data_prep import build_indexed, input_files, sources
from data_prep import manifest as mf


def article(i: int) -> str:
    """One article as WikiExtractor writes it: the title repeated, a blank line, the paragraphs, then </doc>."""
    return (f'<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="Title {i}">\nTitle {i}\n\n'
            f"Article {i} opens here. It goes on.\nIts second paragraph, number {i}.\n</doc>\n")


def wiki_folder(root, files=3, per_file=40):
    for f in range(files):
        (root / "AA").mkdir(parents=True, exist_ok=True)
        (root / "AA" / f"wiki_{f:02d}").write_text("".join(article(f * per_file + i) for i in range(per_file)))
    return root


def expected(i):
    return [f"Title {i}", f"Article {i} opens here. It goes on.", f"Its second paragraph, number {i}."]


def read(path, **kw):
    skipped, where = Counter(), []
    docs = [d.lines for d in sources.iter_documents(str(path), skipped=skipped,
                                                    on_skip=lambda r, w: where.append((r, w)), **kw)]
    return docs, skipped, where


def test_wikiextractor_files_are_read_as_they_come_one_document_per_article(tmp_path):
    wiki_folder(tmp_path / "text")
    skipped, where = Counter(), []
    paths = input_files.expand_inputs([str(tmp_path / "text")], skipped, lambda r, w: where.append(w))
    assert [os.path.relpath(p, tmp_path) for p in paths] == ["text/AA/wiki_00", "text/AA/wiki_01", "text/AA/wiki_02"]
    assert not skipped and not where
    docs = [d for p in paths for d in read(p)[0]]
    assert docs == [expected(i) for i in range(120)]  # tags dropped, the title line kept, no article cut in two
    # byte-range pieces cut at <doc> lines: the same documents as a whole-file read
    bounds = input_files.piece_bounds(paths[0], 300)
    assert len(bounds) > 5
    assert [d.lines for a, b in bounds for d in sources.iter_documents(paths[0], start=a, end=b)] == docs[:40]
    # the usual workaround, renamed to .txt, must not become 2 documents per article with the tags as sentences
    renamed = tmp_path / "wiki_00.txt"
    renamed.write_bytes((tmp_path / "text" / "AA" / "wiki_00").read_bytes())
    assert read(renamed)[0] == docs[:40]
    # text outside a block is dropped and counted, an empty block is an empty document
    odd = tmp_path / "odd" / "wiki_07"
    odd.parent.mkdir()
    odd.write_text(article(1) + "stray line\n" + '<doc id="2" url="u" title="t">\n\n</doc>\n')
    assert read(odd)[0:2] == ([expected(1)], {"text_outside_doc": 1, "empty_document": 1})
    # WikiExtractor --json writes JSON lines into the same extension-less names
    js = tmp_path / "js" / "AA" / "wiki_00"
    js.parent.mkdir(parents=True)
    js.write_text(json.dumps({"id": "1", "title": "T", "text": "T\n\nBody."}) + "\n")
    assert input_files.expand_inputs([str(tmp_path / "js")]) == [str(js)] and read(js)[0] == [["T", "Body."]]


def test_unsupported_files_are_one_line_with_a_count_not_one_line_each(tmp_path):
    for i in range(50):
        (tmp_path / f"part-{i:05d}.parquet").write_bytes(b"PAR1")
    (tmp_path / "notes.txt").write_text("One doc.\n")
    skipped, where = Counter(), []
    got = input_files.expand_inputs([str(tmp_path)], skipped, lambda r, w: where.append((r, w)))
    assert got == [str(tmp_path / "notes.txt")] and skipped == {"unsupported_file": 50}
    assert len(where) == 1 and where[0][0] == "unsupported_file"
    assert "50 file(s)" in where[0][1] and "part-00000.parquet" in where[0][1] and "JSON lines" in where[0][1]


def test_a_file_in_another_encoding_stops_instead_of_building_fragments(tmp_path):
    gb = tmp_path / "sogou.txt"
    gb.write_bytes("".join(f"第{i}号新闻。今天天气很好，我们去公园散步。\nDebian {i}\n\n" for i in range(300))
                   .encode("gb18030"))
    with pytest.raises(sources.InputError, match=r"sogou.txt.*300 of 900 lines .*not valid UTF-8.*iconv -f GB18030"):
        read(gb)
    # a handful of bad lines in a large file stays what it was: counted, skipped, the first ones named
    noisy = tmp_path / "noisy.txt"
    noisy.write_bytes(b"".join(b"good line %d\n\n" % i if i % 200 else b"bad \xff line\n\n" for i in range(2000)))
    docs, skipped, where = read(noisy)
    assert len(docs) == 1990 and skipped == {"invalid_utf8": 10} and where[0][1].startswith(f"{noisy}:1:")


def test_a_json_array_is_named_as_such_not_as_a_missing_key(tmp_path):
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"text": "Hello."}, {"text": "World."}]))
    docs, skipped, where = read(arr)
    assert docs == [] and skipped == {"not_json_lines": 1}
    assert "JSON array of 2" in where[0][1] and "jq -c" in where[0][1] and "--json-key" not in where[0][1]
    pretty = tmp_path / "p.json"
    pretty.write_text(json.dumps([{"text": "Hello."}] * 50, indent=2))
    docs, skipped, where = read(pretty)
    assert docs == [] and skipped == {"not_json_lines": 1}  # once for the file, not invalid_json on every line


def test_a_bom_in_the_middle_of_a_file_is_not_text(tmp_path):
    cat = tmp_path / "cat.txt"
    cat.write_bytes("\ufeffDoc A.\n\n".encode() + "\ufeffDoc B.\n".encode())
    assert read(cat)[0] == [["Doc A."], ["Doc B."]]


# ---------------------------------------------------------------------------------------------------- build_indexed


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from data_prep import train_tokenizer

    root = tmp_path_factory.mktemp("tok")
    (root / "t.txt").write_text("".join(expected(i)[1] + "\n\n" for i in range(200)))
    train_tokenizer.main(["--kind", "bbpe", "--input", str(root / "t.txt"), "--output", str(root / "bbpe"),
                          "--vocab-size", "300", "--quiet"])
    return str(root / "bbpe")


def build(inputs, tokenizer, prefix, *extra):
    return build_indexed.main(["--input", *map(str, inputs), "--tokenizer", tokenizer, "--output-prefix",
                               str(prefix), *extra])


def test_build_indexed_reads_a_wikiextractor_folder(tiny_tokenizer, tmp_path, capsys):
    src = wiki_folder(tmp_path / "text", files=2, per_file=30)
    assert build([src], tiny_tokenizer, tmp_path / "out" / "wiki") == 0
    m = mf.read_manifest(str(tmp_path / "out" / "wiki"))
    assert m["totals"]["documents"] == 60 and m["skipped"] == {}
    assert "skipped input: none" in capsys.readouterr().out


def test_build_indexed_refuses_a_run_that_loses_a_large_share_of_its_records(tiny_tokenizer, tmp_path, capsys):
    src = tmp_path / "mix"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"Doc {i}."}) + "\n" for i in range(100)))
    (src / "b.jsonl").write_text("".join(json.dumps({"content": f"Doc {i}."}) + "\n" for i in range(100)))
    prefix = tmp_path / "out" / "mix"
    assert build([src], tiny_tokenizer, prefix) == 2
    err = capsys.readouterr().err
    assert "missing_json_key 100" in err and "--max-bad-share" in err and "--json-key" in err
    assert f"{src / 'b.jsonl'}: missing_json_key 100" in err  # which input lost what
    assert not mf.manifest_path(str(prefix)).exists()
    # accepting the loss finalizes the finished pieces
    assert build([src], tiny_tokenizer, prefix, "--max-bad-share", "1") == 0
    assert mf.read_manifest(str(prefix))["totals"]["documents"] == 100
    # 300 unsupported files beside one .txt: not a 1-document corpus with exit 0
    many = tmp_path / "many"
    many.mkdir()
    for i in range(300):
        (many / f"part-{i:05d}").write_text("plain text, no extension\n")
    (many / "notes.txt").write_text("One doc.\n")
    assert build([many], tiny_tokenizer, tmp_path / "out" / "many") == 2
    out = capsys.readouterr()
    assert "unsupported_file 300" in out.err
    assert sum("unsupported_file" in line for line in (out.out + out.err).splitlines()) <= 2
    # a GB18030 file stops the run, naming the file and the conversion
    gb = tmp_path / "gb" / "news.txt"
    gb.parent.mkdir()
    gb.write_bytes("".join(f"第{i}号新闻。\nDebian {i}\n\n" for i in range(100)).encode("gb18030"))
    assert build([gb], tiny_tokenizer, tmp_path / "out" / "gb") == 2
    assert "iconv -f GB18030 -t UTF-8" in capsys.readouterr().err


def test_a_file_with_cr_only_line_ends_stops_instead_of_merging_its_documents(tmp_path):
    mac = tmp_path / "mac.txt"
    mac.write_bytes(b"Doc A line one.\rDoc A line two.\r\rDoc B.\r")
    with pytest.raises(sources.InputError, match=r"mac.txt: its lines end in CR alone.*tr '\\r' '\\n'"):
        read(mac)
    crlf = tmp_path / "dos.txt"  # CRLF stays fine
    crlf.write_bytes(b"Doc A line one.\r\nDoc A line two.\r\n\r\nDoc B.\r\n")
    assert read(crlf)[0] == [["Doc A line one.", "Doc A line two."], ["Doc B."]]


def test_a_large_compressed_input_is_said_to_be_one_worker_s_piece(tmp_path):
    """A compressed file cannot be cut at byte offsets, so build_indexed reads it as one piece on one worker: with
    several workers and such files holding most of the input, the run says so and how to cut them (a review measured
    92.8 s instead of 47.8 s on 50 MB with 2 workers, silently)."""
    import gzip

    from data_prep.bad_input import one_piece_note
    from data_prep.prep_work import Settings, plan_pieces

    text = "".join(f'{{"text": "document {i} has a few words in it."}}\n' for i in range(20000)).encode()
    big = tmp_path / "big.jsonl.gz"
    with gzip.open(big, "wb", compresslevel=1) as fh:
        fh.write(text)
    small = tmp_path / "small.jsonl"
    small.write_bytes(text[:20000])
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(text)
    chunk = 16 << 10
    settings = Settings("text", False, chunk, 1 << 30, 1 << 30, 1 << 20, 1 << 26, "uint16")
    inputs = [str(big), str(small)]
    note = one_piece_note(inputs, plan_pieces(inputs, settings), chunk, processes=4)
    assert note and "1 compressed input(s)" in note and "big.jsonl.gz" in note and "split -C" in note
    assert one_piece_note(inputs, plan_pieces(inputs, settings), chunk, processes=1) is None  # one worker anyway
    plain_inputs = [str(plain), str(small)]
    assert one_piece_note(plain_inputs, plan_pieces(plain_inputs, settings), chunk, processes=4) is None  # cut up


def test_a_few_bad_lines_in_long_documents_are_measured_against_lines_not_documents(tiny_tokenizer, tmp_path):
    """A books-style corpus: 50 documents of 500 lines, 20 lines (0.08 %) holding a stray latin-1 byte. The per-file
    encoding check accepts it and so must the bad-share guard: counted against the 50 documents it read as 28.6 %
    and refused the build (review of 2026-12-06)."""
    src = tmp_path / "books.txt"
    lines = []
    for d in range(50):
        for i in range(500):
            lines.append(f"Book {d} line {i} tells a story.".encode())
        lines.append(b"")
    for k in range(20):
        lines[k * 1200 + 7] = b"caf\xe9 au lait, line " + str(k).encode()
    src.write_bytes(b"\n".join(lines) + b"\n")
    prefix = tmp_path / "out" / "books"
    assert build([src], tiny_tokenizer, prefix) == 0
    m = mf.read_manifest(str(prefix))
    assert m["totals"]["documents"] == 50 and m["skipped"].get("invalid_utf8") == 20
