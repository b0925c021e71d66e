"""build_indexed.py and inspect_indexed.py end to end: counts, megatron-core reading our shards, worker-count
independence, bad input in the manifest, checksum verification, up-to-date reruns. Restarts and kills:
tests/test_build_indexed_restarts.py."""
import bz2
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import zstandard

from data_prep import build_indexed, inspect_indexed, sources
from data_prep import manifest as mf
from data_prep.sentences import split_sentences
from data_prep.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def en_tokenizer(en_corpus, tmp_path_factory) -> str:
    """A small WordPiece tokenizer trained by data_prep/train_tokenizer.py on the English corpus (~2 s)."""
    from data_prep import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "wp"
    train_tokenizer.main(["--kind", "wordpiece", "--input", str(en_corpus), "--output", str(out),
                          "--vocab-size", "2000", "--quiet"])
    return str(out)


@pytest.fixture(scope="session")
def en_slice(en_corpus, tmp_path_factory) -> Path:
    """The first ~600 KB of the English corpus, cut at a document boundary: enough for several pieces, quick."""
    data = en_corpus.read_bytes()
    path = tmp_path_factory.mktemp("slice") / "en_slice.txt"
    path.write_bytes(data[: data.index(b"\n\n", 600_000) + 2])
    return path


def build(inputs, tokenizer, prefix, *extra):
    return build_indexed.main(["--input", *map(str, inputs), "--tokenizer", tokenizer, "--output-prefix",
                               str(prefix), *extra])


def output_files(prefix) -> dict[str, bytes]:
    """Every file of an output (shards and manifest) by name, for byte-for-byte comparisons."""
    root, name = Path(prefix).parent, Path(prefix).name
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name.startswith(name) and p.is_file()}


def read_shards(prefix):
    """Documents as lists of token arrays, through megatron-core's reader alone."""
    m = mf.read_manifest(prefix)
    docs = []
    for shard in m["shards"]:
        ds = inspect_indexed.open_shard(str(Path(prefix).parent / shard["prefix"]))
        for d in range(len(ds.document_indices) - 1):
            # copies: the arrays are views of the mmap, which closes when `ds` is collected
            docs.append([np.array(ds[s]) for s in range(ds.document_indices[d], ds.document_indices[d + 1])])
    return m, docs


def test_counts_and_tokens_match_the_input(en_slice, en_tokenizer, tmp_path):
    prefix = tmp_path / "out" / "en"
    assert build([en_slice], en_tokenizer, prefix, "--split-sentences", "--chunk-size-mb", "0.15") == 0
    m, docs = read_shards(prefix)
    expected = [d.lines for d in sources.iter_documents(str(en_slice))]
    sentences = [[s for line in doc for s in split_sentences(line)] for doc in expected]
    assert m["totals"]["shards"] == len(m["shards"]) >= 4
    assert m["totals"]["documents"] == len(docs) == len(expected)
    assert m["totals"]["sentences"] == sum(map(len, docs)) == sum(map(len, sentences))
    assert m["skipped"] == {}
    assert [s["prefix"] for s in m["shards"]] == [f"en_{i:05d}" for i in range(len(m["shards"]))]
    # every token, as megatron-core returns it, equals the tokenizer's encoding of that sentence
    tok = load_tokenizer(en_tokenizer)
    assert m["dtype"] == "uint16" and docs[0][0].dtype == np.uint16
    assert m["tokenizer"]["fingerprint"] == tok.fingerprint
    flat_ref = tok.encode_batch([s for doc in sentences for s in doc])
    flat_got = [seq.tolist() for doc in docs for seq in doc]
    assert flat_got == flat_ref
    assert m["totals"]["tokens"] == sum(map(len, flat_ref))
    assert not Path(f"{prefix}.work").exists()


def test_output_independent_of_workers_and_piece_order(en_slice, en_tokenizer, tmp_path):
    one, two = tmp_path / "w1" / "c", tmp_path / "w2" / "c"
    args = ("--chunk-size-mb", "0.12", "--shard-size-mb", "0.03")  # several pieces, several shards per piece
    assert build([en_slice], en_tokenizer, one, "--workers", "1", *args) == 0
    assert build([en_slice], en_tokenizer, two, "--workers", "2", "--tokenizer-threads", "2", *args) == 0
    a, b = output_files(one), output_files(two)
    assert len(a) > 10 and a == b
    pieces = {tuple(s["input_range"]) for s in mf.read_manifest(one)["shards"]}
    assert len(pieces) < len(mf.read_manifest(one)["shards"])  # some piece made more than one shard


def test_bad_and_compressed_inputs_are_counted_in_the_manifest(en_slice, en_tokenizer, tmp_path):
    data = en_slice.read_bytes()
    half = data[: data.index(b"\n\n", len(data) // 2) + 2]
    src = tmp_path / "src"
    (src / "z").mkdir(parents=True)
    (src / "a.txt.gz").write_bytes(gzip.compress(half))
    (src / "b.txt.bz2").write_bytes(bz2.compress(half))
    docs = [d.lines for d in sources.iter_documents(str(en_slice))][:500]  # all of them if fewer
    (src / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": "\n".join(d)}) + "\n" for d in docs).encode()))
    (src / "d.txt").write_bytes(b"ok line\nbad \xff byte\n\nnul \x00\n\n" + b"x" * 3_000_000 + b"\nfine\n")
    (src / "e.jsonl").write_text('{"text": "a"}\n{broken\n{"other": 1}\n{"text": ""}\n', encoding="utf-8")
    (src / "z" / "cut.txt.gz").write_bytes(gzip.compress(data)[:100_000])
    (src / "z" / "README.md").write_text("not an input")
    prefix = tmp_path / "out" / "mix"
    assert build([src], en_tokenizer, prefix, "--max-line-mb", "1") == 0
    m, got = read_shards(prefix)
    assert m["skipped"] == {"empty_document": 1, "invalid_json": 1, "invalid_utf8": 1, "line_too_long": 1,
                            "missing_json_key": 1, "nul_bytes": 1, "truncated_input": 1, "unsupported_file": 1}
    n_half = len(list(sources.iter_documents(str(src / "a.txt.gz"))))
    n_cut = len(list(sources.iter_documents(str(src / "z" / "cut.txt.gz"))))
    assert m["totals"]["documents"] == 2 * n_half + len(docs) + 2 + 1 + n_cut
    assert [Path(i["path"]).name for i in m["inputs"]] == ["a.txt.gz", "b.txt.bz2", "c.jsonl.zst", "d.txt",
                                                             "e.jsonl", "cut.txt.gz"]
    assert m["inputs"][0]["bytes"] == (src / "a.txt.gz").stat().st_size


def test_inputs_that_stop_the_run(en_tokenizer, tmp_path, capsys):
    assert build([tmp_path / "missing.txt"], en_tokenizer, tmp_path / "o") == 2
    assert "missing.txt' matches no file" in capsys.readouterr().err
    (tmp_path / "dir.txt").mkdir()
    assert build([tmp_path / "dir.txt"], en_tokenizer, tmp_path / "o") == 2
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(SystemExit, match="hold no documents.*empty_document"):
        build([tmp_path / "empty.jsonl"], en_tokenizer, tmp_path / "o")


def test_inspect_verifies_and_detects_corruption(en_slice, en_tokenizer, tmp_path, capsys):
    prefix = tmp_path / "c"
    assert build([en_slice], en_tokenizer, prefix, "--chunk-size-mb", "0.2") == 0
    capsys.readouterr()
    assert inspect_indexed.main([str(prefix), "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "verified: 3 shard(s)" in out and "--- document 1" in out
    tok = load_tokenizer(en_tokenizer)  # the corpus's first sentence, decoded from shard 0 (uncased WordPiece)
    first = en_slice.read_text(encoding="utf-8").splitlines()[0]
    assert len(first) > 20 and tok.decode(tok.encode(first)) in out
    # flip one token in the middle of shard 1: the checksum catches it and names the shard
    shard = Path(f"{prefix}_00001.bin")
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    assert inspect_indexed.main([str(prefix), "--show", "0"]) == 1
    assert "FAILED c_00001: c_00001.bin checksum differs" in capsys.readouterr().out
    Path(f"{prefix}_00002.idx").unlink()
    assert inspect_indexed.main([str(prefix), "--show", "0"]) == 1
    assert "c_00002: missing c_00002.idx" in capsys.readouterr().out


@pytest.mark.slow
def test_builtin_pydocs_with_workers(en_tokenizer, tmp_path):
    prefix = tmp_path / "py"
    # no --chunk-size-mb: ~12 MB of input is cut into 4 MB pieces (the old fixed 256 MB made one piece: one busy
    # worker of two), one or more shards each
    assert build(["builtin:pydocs"], en_tokenizer, prefix, "--workers", "2") == 0
    m, docs = read_shards(prefix)
    assert m["totals"]["documents"] == len(docs) > 200  # (which documents: tests/test_sources.py)
    assert m["inputs"] == [{"path": "builtin:pydocs", "bytes": sources.input_bytes("builtin:pydocs")}]
    assert m["settings"]["chunk_bytes"] == 4 << 20
    assert len(m["shards"]) >= 3


def test_default_piece_size_follows_the_input_size_only():
    from data_prep.prep_work import auto_chunk_bytes
    mb = 1 << 20
    assert auto_chunk_bytes(1000) == 4 * mb            # floor: tiny inputs are one or few pieces
    assert auto_chunk_bytes(97 * mb) == 4 * mb         # 25 pieces: >= 4 per worker up to 6 workers
    assert auto_chunk_bytes(2048 * mb) == 32 * mb      # 64 pieces
    assert auto_chunk_bytes(100 * 1024 * mb) == 256 * mb  # ceiling: the former fixed default


def test_annotate_writes_a_side_car_per_shard(en_slice, en_tokenizer, tmp_path):
    gazetteer = tmp_path / "gaz.txt"
    gazetteer.write_text("computer\nunix\nmicroprocessor\n", encoding="utf-8")
    prefix = tmp_path / "c"
    assert build([en_slice], en_tokenizer, prefix, "--chunk-size-mb", "0.3",
                 "--annotate", f"gazetteer-lower:{gazetteer}") == 0
    m = mf.read_manifest(prefix)
    for shard in m["shards"]:
        header = json.loads((tmp_path / f"{shard['prefix']}.spans.json").read_text())
        assert header["sequences"] == shard["sentences"]
    assert sum(json.loads((tmp_path / f"{s['prefix']}.spans.json").read_text())["spans"] for s in m["shards"]) > 10
    assert build([en_slice], en_tokenizer, tmp_path / "d", "--annotate", "nonsense") == 2


@pytest.mark.parametrize("env,world", [
    ({}, (0, 1, 1)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (1, 4, 2)),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, (2, 3, 1)),
    ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}, (5, 8, 4)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, (0, 1, 1)),  # a batch script, not an srun step: one process
])
def test_world_from_the_launcher_environment(monkeypatch, env, world):
    for key in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID",
                "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    w = build_indexed.detect_world()
    assert (w.rank, w.size, w.local_size) == world


def test_a_cut_short_or_extended_shard_is_refused_at_open_and_the_named_command_rebuilds_it(
        en_slice, en_tokenizer, tmp_path):
    """Issue 21 item 4: a .bin cut to half (an interrupted copy) or an .idx with extra bytes stops the corpus open
    (every rank opens it before any step) with the shard's name and the command that rebuilds the corpus; that
    command, run as printed, restores the corpus. Before: the half .bin opened, and its samples came back empty."""
    import shlex

    from trainer.data.corpus import IndexedCorpus

    prefix = tmp_path / "c"
    assert build([en_slice], en_tokenizer, prefix, "--chunk-size-mb", "0.2", "--split-sentences") == 0
    good = output_files(prefix)
    corpus = IndexedCorpus(prefix)
    tokens = corpus.num_sentences
    shard = Path(f"{prefix}_00001.bin")
    shard.write_bytes(good[shard.name][: len(good[shard.name]) // 2])  # what an interrupted copy leaves
    with pytest.raises(ValueError, match=r"shard .*c_00001: \.bin is [\d,]+ bytes, the manifest says") as err:
        IndexedCorpus(prefix)
    message = str(err.value)
    assert "c.manifest.json" in message and type(err.value).__name__ == "ShardMismatch"
    command = message.split("rebuild the corpus with\n    ")[1].split("\n")[0]
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "data_prep.build_indexed"] and "--split-sentences" in args
    assert "--chunk-size-mb" in args and str(en_slice) in args and str(prefix) in args
    assert build_indexed.main(args[3:]) == 0  # the printed command, as a user would paste it
    assert output_files(prefix) == good and IndexedCorpus(prefix).num_sentences == tokens
    # an .idx with trailing bytes: refused too, and the same command rebuilds it (it was "up to date" before)
    idx = Path(f"{prefix}_00002.idx")
    idx.write_bytes(good[idx.name] + b"\0" * 8)
    with pytest.raises(ValueError, match=r"shard .*c_00002: \.idx is [\d,]+ bytes"):
        IndexedCorpus(prefix)
    assert build_indexed.main(args[3:]) == 0
    assert output_files(prefix) == good


def small_text(path: Path, docs: int = 40) -> Path:
    """A tiny .txt input: ``docs`` documents of two sentences."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"Document {i} talks about unix. It has a second sentence.\n\n" for i in range(docs)),
                    encoding="utf-8")
    return path


def test_output_inside_an_input_folder_is_never_read_as_input(en_tokenizer, tmp_path, capsys):
    """Reviewer bug 1: with the output prefix under an --input folder, the second run read its own manifest (.json =
    JSON lines), work-folder records and shards as input, deleted the manifest and crashed on it. Now they are left
    out (with a note), the rerun is up to date, and a killed run's work folder is not read either."""
    src = tmp_path / "src"
    small_text(src / "a.txt")
    prefix = src / "shards" / "c"
    assert build([src], en_tokenizer, prefix) == 0
    first = output_files(prefix)
    capsys.readouterr()
    assert build([src], en_tokenizer, prefix) == 0
    out = capsys.readouterr().out
    assert "up to date" in out and "not read as input" in out
    assert output_files(prefix) == first
    assert [i["path"] for i in mf.read_manifest(prefix)["inputs"]] == [str(src / "a.txt")]
    # what a killed run and an annotation leave beside the output: none of it is an input
    work = Path(f"{prefix}.work")
    work.mkdir()
    (work / "piece_000000.json").write_text("{}")
    Path(f"{prefix}_00000.spans.json").write_text("{}")
    excluded = []
    assert sources.expand_inputs([str(src)], output_prefix=str(prefix), excluded=excluded) == [str(src / "a.txt")]
    assert sorted(Path(p).name for p in excluded) == ["c.manifest.json", "c.work", "c_00000.bin", "c_00000.idx",
                                                      "c_00000.spans.json"]
    with pytest.raises(sources.InputError, match="is an output of this command"):
        sources.expand_inputs([f"{prefix}.manifest.json"], output_prefix=str(prefix))
    # an input named like the output's shards, beside it, is still an input
    Path(f"{prefix}_00001.jsonl").write_text('{"text": "x"}\n')
    assert str(prefix) + "_00001.jsonl" in sources.expand_inputs([str(src)], output_prefix=str(prefix))


def test_lone_surrogate_escape_is_skipped_and_counted_by_both_tools(en_tokenizer, tmp_path, capsys):
    """Reviewer bug 3: a JSON line with an unpaired surrogate escape ("\\ud83d", crawled text cut mid-emoji) killed
    build_indexed (TypeError in encode_batch, no file named) and train_tokenizer (UnicodeEncodeError). Now the line
    is skipped as lone_surrogate, named by file:line, in both; a proper pair (an emoji) is kept."""
    from data_prep import train_tokenizer

    src = tmp_path / "crawl.jsonl"
    lines = [json.dumps({"text": f"Plain line number {i} about unix systems."}) for i in range(60)]
    lines[1] = '{"text": "cut emoji \\ud83d here"}'
    lines[2] = '{"text": "whole emoji \\ud83d\\ude00 here"}'
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = tmp_path / "c"
    assert build([src], en_tokenizer, prefix) == 0
    m = mf.read_manifest(prefix)
    assert m["skipped"] == {"lone_surrogate": 1} and m["totals"]["documents"] == 59
    assert f"skipped (lone_surrogate): {src}:2:" in capsys.readouterr().err
    out = tmp_path / "tok"
    assert train_tokenizer.main(["--kind", "wordpiece", "--input", str(src), "--output", str(out),
                                 "--vocab-size", "200", "--quiet"]) == 0
    meta = json.loads((out / "bertfamily_tokenizer.json").read_text())
    assert "lone_surrogate" in json.dumps(meta)


def test_annotate_on_an_up_to_date_corpus_writes_only_the_missing_side_cars(en_tokenizer, tmp_path, capsys):
    """Reviewer bug 5: --annotate was ignored when the shards were up to date ("nothing to do"), so an annotation
    killed midway could never be finished by rerunning the command (the one trainer/ernie/sidecars.py names). Now
    an up-to-date build with --annotate writes the side-cars that are missing or incomplete, keeps the complete
    ones, and records them all in the manifest."""
    from data_prep import annotate

    src = small_text(tmp_path / "a.txt", docs=300)
    gazetteer = tmp_path / "gaz.txt"
    gazetteer.write_text("unix\n", encoding="utf-8")
    spec = f"gazetteer-lower:{gazetteer}"
    prefix = tmp_path / "c"
    common = ("--chunk-size-mb", "0.004")
    assert build([src], en_tokenizer, prefix, *common) == 0
    n = len(mf.read_manifest(prefix)["shards"])
    assert n >= 3
    assert build([src], en_tokenizer, prefix, *common, "--annotate", spec) == 0  # the shards are up to date
    assert all(Path(f"{prefix}_{i:05d}.spans.json").exists() for i in range(n))
    assert len(annotate.complete_sidecars(prefix, spec)) == n
    assert all(s["sidecar"]["annotator"] == spec for s in mf.read_manifest(prefix)["shards"])
    # what a kill during the annotation leaves: one side-car without its header, nothing recorded in the manifest
    Path(f"{prefix}_00001.spans.json").unlink()
    m = json.loads(mf.manifest_path(prefix).read_text())
    for s in m["shards"]:
        del s["sidecar"]
    mf.manifest_path(prefix).write_text(json.dumps(m))
    kept = Path(f"{prefix}_00000.spans.npy").stat().st_mtime_ns
    capsys.readouterr()
    assert build([src], en_tokenizer, prefix, *common, "--annotate", spec) == 0
    assert f"annotated 1 shard(s) with {spec}" in capsys.readouterr().out
    assert Path(f"{prefix}_00000.spans.npy").stat().st_mtime_ns == kept
    assert len(annotate.complete_sidecars(prefix, spec)) == n
    assert all(s["sidecar"]["annotator"] == spec for s in mf.read_manifest(prefix)["shards"])
    # complete and recorded: nothing is rewritten
    before = mf.manifest_path(prefix).stat().st_mtime_ns
    assert build([src], en_tokenizer, prefix, *common, "--annotate", spec) == 0
    assert "annotated 0 shard(s)" in capsys.readouterr().out
    assert mf.manifest_path(prefix).stat().st_mtime_ns == before


def test_an_output_prefix_that_names_a_folder_is_refused(en_tokenizer, tmp_path, capsys):
    """Reviewer bug 8: ``--output-prefix DIR/`` (or an existing folder) wrote a hidden ``.manifest.json`` and an
    unusable corpus, and reported success. Now it is refused before any work, saying what to give instead."""
    src = small_text(tmp_path / "a.txt", docs=3)
    (tmp_path / "existing").mkdir()
    for prefix in (f"{tmp_path / 'out'}/", str(tmp_path / "existing")):
        with pytest.raises(SystemExit) as err:
            build([src], en_tokenizer, prefix)
        assert err.value.code == 2
        assert "names a folder; give FOLDER/NAME" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and list((tmp_path / "existing").iterdir()) == []


@pytest.mark.parametrize("option,value", [("--shard-sequences", "0"), ("--tokenizer-threads", "-1"),
                                          ("--chunk-size-mb", "nan"), ("--shard-size-mb", "inf"),
                                          ("--max-line-mb", "nan"), ("--max-document-mb", "-1")])
def test_invalid_numbers_are_refused_naming_the_option(option, value, capsys):
    """Reviewer (smaller items): --shard-sequences 0 and nan sizes got through (nan <= 0 is False) and failed later
    or wrote nonsense; now each is refused at parse time, naming the option and the value."""
    with pytest.raises(SystemExit) as err:
        build_indexed.parse_args(["--input", "x.txt", "--tokenizer", "t", "--output-prefix", "o/c", option, value])
    assert err.value.code == 2 and f"{option} {value}" in capsys.readouterr().err


def test_train_tokenizer_names_the_first_skipped_line_of_each_reason(tmp_path, capsys):
    """Reviewer (smaller items): train_tokenizer printed only counts of skipped input ("invalid_utf8: 2"), where
    build_indexed names the file and line; now each reason's count comes with its first occurrence."""
    from data_prep import train_tokenizer

    src = tmp_path / "a.txt"
    src.write_bytes(b"good line about unix\nbad \xff byte\n\n" + b"another good line\n" * 30 + b"more \xfe\n")
    assert train_tokenizer.main(["--kind", "wordpiece", "--input", str(src), "--output", str(tmp_path / "tok"),
                                 "--vocab-size", "100", "--quiet"]) == 0
    assert f"invalid_utf8: 2 (first: {src}:2: invalid UTF-8" in capsys.readouterr().out


def test_a_rebuild_into_fewer_shards_removes_the_side_cars_of_the_shards_it_removes(en_tokenizer, tmp_path):
    """Noticed while fixing reviewer bug 5: a rebuild of an annotated prefix into fewer shards removed the stale
    shards numbered past the end but left their side-cars (.spans.json/.npy/.ptr.npy) behind, describing shards that
    no longer exist."""
    src = small_text(tmp_path / "a.txt", docs=300)
    gazetteer = tmp_path / "gaz.txt"
    gazetteer.write_text("unix\n", encoding="utf-8")
    prefix = tmp_path / "c"
    assert build([src], en_tokenizer, prefix, "--chunk-size-mb", "0.004", "--annotate", f"gazetteer:{gazetteer}") == 0
    assert len(mf.read_manifest(prefix)["shards"]) >= 3 and Path(f"{prefix}_00002.spans.ptr.npy").exists()
    assert build([src], en_tokenizer, prefix, "--chunk-size-mb", "1") == 0
    assert len(mf.read_manifest(prefix)["shards"]) == 1
    assert sorted(p.name for p in tmp_path.glob("c_*")) == ["c_00000.bin", "c_00000.idx", "c_00000.spans.json",
                                                            "c_00000.spans.npy", "c_00000.spans.ptr.npy"]
