"""build_indexed.py on many small input files: consecutive small inputs are grouped into pieces of up to the piece
size (prep_work.plan_pieces), so 300 files make a handful of shards, with the same documents and tokens in the same
order as one piece per file, the manifest still saying which input each document came from, bad input still named
by file and line, and restarts (after a kill, or of a work folder planned one piece per file) handled."""
import json
import os
import sys
from pathlib import Path

import pytest

import fork_server
from data_prep import build_indexed, sources
from data_prep import manifest as mf
from data_prep.prep_work import Settings, plan_pieces
from test_build_indexed import (REPO, build, en_slice, en_tokenizer, output_files,  # noqa: F401 (fixtures)
                                read_shards)

N_FILES = 300
ARGS = ("--chunk-size-mb", "0.03", "--shard-size-mb", "0.004")  # ~6 groups, several shards each (some cut mid-file)


@pytest.fixture(scope="module")
def small_files(en_slice, tmp_path_factory) -> Path:
    """300 tiny inputs (one to three documents each, .txt and .jsonl), one empty, one with two bad JSON lines."""
    docs = [[line[:200] for line in d.lines[:2]] for d in sources.iter_documents(str(en_slice))]
    root = tmp_path_factory.mktemp("small")
    k = 0
    for i in range(N_FILES):
        mine = [docs[(k + j) % len(docs)] for j in range(1 + i % 3)]
        k += len(mine)
        if i % 5 == 0:
            lines = [json.dumps({"text": "\n".join(d)}) for d in mine]
            if i == 50:
                lines[1:1] = ["{broken", '{"other": 1}']
            (root / f"f{i:04d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        else:
            (root / f"f{i:04d}.txt").write_text("".join("\n".join(d) + "\n\n" for d in mine), encoding="utf-8")
    (root / "f0100.txt").write_text("")  # an input with no document at all
    return root


def per_file_plan(inputs, settings):
    """How build_indexed planned before grouping: at least one piece per input."""
    return plan_pieces(inputs, settings, group=False)


def document_inputs(manifest: dict) -> list[str]:
    """The input of each document of the corpus, in order, as a reader of the manifest finds it."""
    names = [i["path"] for i in manifest["inputs"]]
    out = []
    for shard in manifest["shards"]:
        if shard.get("input_documents") is None:
            out += [shard["input"]] * shard["documents"]
        else:
            first = names.index(shard["input"])
            for j, n in enumerate(shard["input_documents"]):
                out += [names[first + j]] * n
            assert sum(shard["input_documents"]) == shard["documents"]
    return out


def test_plan_groups_small_inputs_only(small_files, tmp_path):
    inputs = sorted(str(p) for p in small_files.iterdir())
    big = tmp_path / "big.txt"
    big.write_text("".join(f"Document {i} is here.\n\n" for i in range(6000)), encoding="utf-8")  # ~130 KB
    settings = Settings("text", False, 30_000, 1 << 20, 1000, 1 << 20, 1 << 20, "uint16")
    pieces = plan_pieces(inputs[:150] + [str(big)] + inputs[150:], settings)
    assert [p.paths for p in plan_pieces(inputs[:150] + [str(big)] + inputs[150:], settings)] == \
        [p.paths for p in pieces]  # deterministic
    assert sum(len(p.paths) for p in pieces if p.path != str(big)) == len(inputs) == N_FILES + 1  # + the empty one
    assert [x for p in pieces for x in (p.paths if p.path != str(big) else [])] == inputs
    assert [p.index for p in pieces if p.path == str(big)] and all(not p.more for p in pieces if p.path == str(big))
    assert sum(1 for p in pieces if p.path == str(big)) >= 4  # a large input is still cut as before
    for p in pieces:
        assert p.more == () or sum(os.path.getsize(x) for x in p.paths) <= settings.chunk_bytes
    assert len(pieces) < 20


def test_small_inputs_make_few_shards_with_the_same_documents(small_files, en_tokenizer, tmp_path, monkeypatch,
                                                              capfd):
    grouped, per_file = tmp_path / "g" / "c", tmp_path / "f" / "c"
    assert build([small_files], en_tokenizer, grouped, *ARGS, "--workers", "2", "--split-sentences") == 0
    err = capfd.readouterr().err  # capfd: the pool workers' warnings
    assert "f0050.jsonl:2" in err and "f0050.jsonl:3" in err  # bad lines are still named by file and line
    with monkeypatch.context() as m:
        m.setattr(build_indexed, "plan_pieces", per_file_plan)
        assert build([small_files], en_tokenizer, per_file, *ARGS, "--split-sentences") == 0
    mg, docs_g = read_shards(grouped)
    mp, docs_p = read_shards(per_file)
    assert len(mp["shards"]) >= N_FILES - 1  # one file per piece: a shard per file with documents
    assert 6 <= len(mg["shards"]) <= 40
    assert [[s.tolist() for s in d] for d in docs_g] == [[s.tolist() for s in d] for d in docs_p]
    assert mg["totals"] == {**mp["totals"], "shards": len(mg["shards"]), "bin_bytes": mg["totals"]["bin_bytes"]}
    assert mg["skipped"] == mp["skipped"] == {"invalid_json": 1, "missing_json_key": 1}
    assert mg["inputs"] == mp["inputs"]
    assert document_inputs(mg) == document_inputs(mp)
    assert len(mf.manifest_path(grouped).read_bytes()) < len(mf.manifest_path(per_file).read_bytes()) / 2
    # a corpus finished one piece per file (by the code before grouping) is up to date for this one: not rebuilt
    before = output_files(per_file)
    capfd.readouterr()
    assert build([small_files], en_tokenizer, per_file, *ARGS, "--split-sentences") == 0
    assert "up to date" in capfd.readouterr().out and output_files(per_file) == before


def run_cli(*args, env=None):
    return fork_server.run([sys.executable, "data_prep/build_indexed.py", *map(str, args)], cwd=REPO,
                           env={**os.environ, **(env or {})}, timeout=300)


def test_restart_after_kill_resumes_grouped_pieces(small_files, en_tokenizer, tmp_path):
    ref, prefix = tmp_path / "ref" / "c", tmp_path / "run" / "c"
    assert build([small_files], en_tokenizer, ref, *ARGS) == 0
    common = ["--input", small_files, "--tokenizer", en_tokenizer, "--output-prefix", prefix, *ARGS]
    killed = run_cli(*common, env={build_indexed.KILL_HOOK: "2"})
    assert killed.returncode == -9, killed.stderr
    records = sorted(Path(f"{prefix}.work").glob("piece_*.json"))
    assert len(records) == 2 and json.loads(records[0].read_text())["piece"]["more"]
    done = run_cli(*common)
    assert done.returncode == 0, done.stderr
    assert "restart: 2 of" in done.stdout
    assert output_files(prefix) == output_files(ref)


def test_a_work_folder_planned_one_piece_per_file_restarts_with_a_note(small_files, en_tokenizer, tmp_path,
                                                                      monkeypatch, capsys):
    """An unfinished run left by a build_indexed from before grouping: same command, other pieces. It cannot be
    reused; the rerun says so and restarts (nothing of it mixed in)."""
    ref, prefix = tmp_path / "ref" / "c", tmp_path / "run" / "c"
    assert build([small_files], en_tokenizer, ref, *ARGS) == 0
    calls = []

    def aborts_after_five(piece):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(piece)
        return real(piece)

    real = build_indexed._build_in_worker
    with monkeypatch.context() as m:
        m.setattr(build_indexed, "plan_pieces", per_file_plan)
        m.setattr(build_indexed, "_build_in_worker", aborts_after_five)
        assert build([small_files], en_tokenizer, prefix, *ARGS) == 2
    assert len(list(Path(f"{prefix}.work").glob("piece_*.json"))) == 5
    capsys.readouterr()
    assert build([small_files], en_tokenizer, prefix, *ARGS) == 0
    out, err = capsys.readouterr()
    assert "planned by an older build_indexed" in err and "restarting the run from the start" in err
    assert "restart:" not in out
    assert output_files(prefix) == output_files(ref)
