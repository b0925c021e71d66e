"""The manifest's tokenizer path (data_prep/manifest.py): stored relative to the manifest's folder when the tokenizer
sits under it or next to it, so a prepared corpus copied elsewhere together with its tokenizer still finds it; old
manifests with an absolute path still read; a missing tokenizer folder stops with a message saying what to do."""
import json
import os
import shutil
from pathlib import Path

import pytest

from data_prep import annotate, build_indexed, inspect_indexed, train_tokenizer
from data_prep import manifest as mf
from data_prep.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def site(en_corpus, tmp_path_factory) -> Path:
    """SITE/tok (a small WordPiece tokenizer) and SITE/corpus/en.* (built from it), both made with paths relative
    to the working directory, as a user on a cluster would type them."""
    root = tmp_path_factory.mktemp("prep")
    data = en_corpus.read_bytes()
    (root / "in.txt").write_bytes(data[: data.index(b"\n\n", 60_000) + 2])
    cwd = os.getcwd()
    os.chdir(root)
    try:
        train_tokenizer.main(["--kind", "wordpiece", "--input", "in.txt", "--output", "site/tok",
                              "--vocab-size", "1000", "--quiet"])
        assert build_indexed.main(["--input", "in.txt", "--tokenizer", "site/tok",
                                   "--output-prefix", "site/corpus/en"]) == 0
    finally:
        os.chdir(cwd)
    return root / "site"


def _stored(prefix) -> dict:
    return json.loads(mf.manifest_path(prefix).read_text(encoding="utf-8"))


def _manifest(tokenizer_path: str) -> dict:
    return {"format": mf.FORMAT, "version": mf.VERSION, "tool_version": "test",
            "tokenizer": {"path": tokenizer_path, "fingerprint": "0" * 64, "kind": "wordpiece", "vocab_size": 1000},
            "dtype": "uint16", "shards": [], "totals": mf.totals_of([], 0), "inputs": [], "skipped": {},
            "settings": {}}


def test_copied_corpus_and_tokenizer_resolve_to_the_new_place(site, tmp_path, monkeypatch, capsys):
    assert _stored(site / "corpus" / "en")["tokenizer"]["path"] == "../tok"  # next to the corpus folder: relative
    moved = tmp_path / "shared" / "copy"
    shutil.copytree(site, moved)
    monkeypatch.chdir(tmp_path)

    prefix = moved / "corpus" / "en"
    m = mf.read_manifest(prefix)
    assert m["tokenizer"]["path"] == str(moved / "tok")
    tok_dir = mf.tokenizer_dir(prefix)
    assert tok_dir == moved / "tok" and tok_dir.is_absolute()
    assert load_tokenizer(tok_dir).fingerprint == m["tokenizer"]["fingerprint"]

    # the whole copy works: checksums verified and documents decoded with the copied tokenizer
    assert inspect_indexed.main([str(prefix), "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{moved / 'tok'}" in out and "verified" in out and "cannot decode" not in out

    # a relative prefix (from another working directory) resolves the same folder
    monkeypatch.chdir(moved)
    assert mf.tokenizer_dir("corpus/en") == moved / "tok"

    # annotating the copy finds the copied tokenizer through the manifest
    gaz = tmp_path / "gaz.txt"
    gaz.write_text("the\nof the\tphrase\n", encoding="utf-8")
    assert annotate.main([str(prefix), "--annotate", f"gazetteer:{gaz}", "--quiet"]) == 0
    assert (moved / "corpus" / "en_00000.spans.json").exists()


def test_rewritten_manifest_stays_relative_and_same_bytes(site, tmp_path):
    """Writing back what read_manifest returned (an absolute, resolved path) stores the same relative path."""
    moved = tmp_path / "copy"
    shutil.copytree(site, moved)
    prefix = moved / "corpus" / "en"
    before = mf.manifest_path(prefix).read_bytes()
    mf.write_manifest(prefix, mf.read_manifest(prefix))
    assert mf.manifest_path(prefix).read_bytes() == before


def test_tokenizer_under_the_corpus_folder_or_far_away(tmp_path):
    corpus = tmp_path / "data" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "tok").mkdir()
    mf.write_manifest(corpus / "en", _manifest(str(corpus / "tok")))
    assert _stored(corpus / "en")["tokenizer"]["path"] == "tok"
    assert mf.tokenizer_dir(corpus / "en") == corpus / "tok"

    far = tmp_path / "home" / "me" / "tok"  # neither under the corpus folder nor under its parent: absolute
    far.mkdir(parents=True)
    mf.write_manifest(corpus / "en", _manifest(str(far)))
    assert _stored(corpus / "en")["tokenizer"]["path"] == str(far)
    assert mf.read_manifest(corpus / "en")["tokenizer"]["path"] == str(far)
    assert mf.tokenizer_dir(corpus / "en") == far


def test_old_manifest_with_an_absolute_path_still_reads(tmp_path):
    """Manifests written before the path became relative hold it absolute (even when it is next to the corpus)."""
    tok = tmp_path / "tok"
    tok.mkdir()
    (tmp_path / "corpus").mkdir()
    prefix = tmp_path / "corpus" / "en"
    # as the old writer stored it: the file itself, not through write_manifest (which would make it relative)
    mf.manifest_path(prefix).write_text(json.dumps(_manifest(str(tok)), indent=1), encoding="utf-8")
    assert mf.read_manifest(prefix)["tokenizer"]["path"] == str(tok)
    assert mf.tokenizer_dir(prefix) == tok


def test_missing_tokenizer_names_the_manifest_and_the_path(site, tmp_path, capsys):
    """A corpus copied without its tokenizer: the error says which manifest, which folder, and what to do."""
    shutil.copytree(site / "corpus", tmp_path / "only" / "corpus")
    prefix = tmp_path / "only" / "corpus" / "en"
    assert mf.read_manifest(prefix)["tokenizer"]["path"] == str(tmp_path / "only" / "tok")  # reading still works
    with pytest.raises(FileNotFoundError) as err:
        mf.tokenizer_dir(prefix)
    msg = str(err.value)
    assert str(mf.manifest_path(prefix)) in msg and str(tmp_path / "only" / "tok") in msg
    assert "'../tok'" in msg and "copy the tokenizer folder" in msg

    with pytest.raises(SystemExit, match="copy the tokenizer folder"):
        annotate.main([str(prefix), "--annotate", "jieba", "--quiet"])

    # an old manifest whose absolute path is gone says so too
    old = tmp_path / "old" / "en"
    old.parent.mkdir()
    mf.manifest_path(old).write_text(json.dumps(_manifest(str(tmp_path / "nowhere"))), encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="stored absolute"):
        mf.tokenizer_dir(old)


def test_empty_tokenizer_path_is_kept_as_is(tmp_path):
    """Hand-made corpora (tests/test_samples.py) record no tokenizer: "" is stored and read back unchanged."""
    mf.write_manifest(tmp_path / "en", _manifest(""))
    assert _stored(tmp_path / "en")["tokenizer"]["path"] == ""
    assert mf.read_manifest(tmp_path / "en")["tokenizer"]["path"] == ""
    with pytest.raises(FileNotFoundError, match="records no tokenizer folder"):
        mf.tokenizer_dir(tmp_path / "en")


def test_trainer_takes_a_copied_corpus_and_names_a_missing_tokenizer(site, tmp_path):
    """The trainer's `model.vocab_size: auto` / `pad_token_id: auto` read the copy's tokenizer; a corpus copied
    without its tokenizer is a config error (exit 2 at launch) naming the manifest and the missing folder."""
    from trainer.config import ConfigError, load_config

    moved = tmp_path / "copy"
    shutil.copytree(site, moved)
    prefix = moved / "corpus" / "en"
    cfg = load_config("tiny_bert", [f"data.corpora=[{{prefix: {prefix}}}]", "model.vocab_size=auto",
                                    "model.pad_token_id=auto"])
    tok = load_tokenizer(moved / "tok")
    assert (cfg.model.vocab_size, cfg.model.pad_token_id) == (tok.vocab_size, tok.pad_id)
    shutil.rmtree(moved / "tok")
    with pytest.raises(ConfigError) as err:
        load_config("tiny_bert", [f"data.corpora=[{{prefix: {prefix}}}]", "model.vocab_size=auto",
                                  "model.pad_token_id=auto"])
    assert str(mf.manifest_path(prefix)) in str(err.value) and str(moved / "tok") in str(err.value)
