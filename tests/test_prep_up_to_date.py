"""When build_indexed calls a corpus up to date (data_prep/prep_work.up_to_date): each input's size and mtime_ns as
recorded in the manifest, compared for equality, not the input's mtime against the manifest file's (which a clock
behind or ahead, cp -p or rsync -a fooled). Found by review."""
import json
import os
import time

from data_prep import manifest as mf
from test_build_indexed import build, en_tokenizer, small_text  # noqa: F401 (fixtures)


def _rebuilds(src, tokenizer, prefix, capsys) -> bool:
    assert build([src], tokenizer, prefix) == 0
    out = capsys.readouterr().out
    return "up to date" not in out


def test_an_input_edited_in_place_with_an_older_mtime_is_rebuilt(en_tokenizer, tmp_path, capsys):
    """Reviewer fault 2: "up to date" compared each input's mtime with the manifest file's: an input rewritten at the
    same size whose mtime is older than the manifest (a node whose clock is behind, cp -p, rsync -a) kept its stale
    corpus. Now the manifest records each input's mtime_ns and a rerun compares it for equality."""
    src = small_text(tmp_path / "a.txt")
    prefix = tmp_path / "out" / "c"
    assert _rebuilds(src, en_tokenizer, prefix, capsys)
    assert not _rebuilds(src, en_tokenizer, prefix, capsys)
    before, size = mf.read_manifest(prefix)["totals"]["tokens"], src.stat().st_size
    text = src.read_text(encoding="utf-8")
    src.write_text(text.replace("unix", "bert"), encoding="utf-8")  # same size, other tokens
    assert src.stat().st_size == size
    older = mf.manifest_path(prefix).stat().st_mtime_ns - 3_600 * 10**9
    os.utime(src, ns=(older, older))
    assert _rebuilds(src, en_tokenizer, prefix, capsys)
    assert mf.read_manifest(prefix)["totals"]["tokens"] != before
    assert mf.read_manifest(prefix)["inputs"][0] == {"path": str(src), "bytes": size, "mtime_ns": older}
    assert not _rebuilds(src, en_tokenizer, prefix, capsys)


def test_an_input_with_an_mtime_ahead_of_the_clock_stays_up_to_date(en_tokenizer, tmp_path, capsys):
    """The other side of fault 2: an input whose mtime lies ahead of this machine's clock (written on a node whose
    clock runs ahead) made every rerun rebuild the corpus, replacing it under the jobs reading it."""
    src = small_text(tmp_path / "a.txt")
    ahead = time.time_ns() + 86_400 * 10**9
    os.utime(src, ns=(ahead, ahead))
    prefix = tmp_path / "out" / "c"
    assert _rebuilds(src, en_tokenizer, prefix, capsys)
    assert not _rebuilds(src, en_tokenizer, prefix, capsys)


def test_a_manifest_without_recorded_mtimes_keeps_the_old_rule(en_tokenizer, tmp_path, capsys):
    """A manifest written before inputs recorded mtime_ns: an input modified after the manifest file is rebuilt, an
    older one is up to date (the old rule), and the rebuilt manifest records mtime_ns."""
    src = small_text(tmp_path / "a.txt")
    prefix = tmp_path / "out" / "c"
    assert _rebuilds(src, en_tokenizer, prefix, capsys)
    path = mf.manifest_path(prefix)
    data = json.loads(path.read_text(encoding="utf-8"))
    for item in data["inputs"]:
        del item["mtime_ns"]
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    assert "mtime_ns" not in mf.read_manifest(prefix)["inputs"][0]
    written = path.stat().st_mtime_ns
    os.utime(src, ns=(written - 10**9, written - 10**9))
    assert not _rebuilds(src, en_tokenizer, prefix, capsys)
    os.utime(src, ns=(written + 10**9, written + 10**9))
    assert _rebuilds(src, en_tokenizer, prefix, capsys)
    assert mf.read_manifest(prefix)["inputs"][0]["mtime_ns"] == written + 10**9
