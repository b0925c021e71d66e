"""The trainer's index cache on a read-only mount (trainer/data/cache_file.ensure): a clear error naming the folder,
data.cache_dir and the prebuild command, instead of a bare OSError. Found by review."""
import errno
import os
import shutil
from pathlib import Path

import pytest

from test_build_indexed import build, en_tokenizer, small_text  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def ro_corpus(tmp_path_factory, en_tokenizer) -> Path:
    root = tmp_path_factory.mktemp("rocorpus")
    src = small_text(root / "a.txt", docs=200)
    assert build([src], en_tokenizer, root / "corpus" / "c", "--split-sentences") == 0
    return root / "corpus" / "c"


def _read_only(monkeypatch, folder: Path) -> list[str]:
    """Writes under ``folder`` fail with EROFS, as on a read-only mount: Path.mkdir, and open() for writing in
    trainer/data/cache_file.py and sample_index.py (the cache's writers). Returns the refused paths."""
    from trainer.data import cache_file, sample_index

    refused = []
    real_mkdir, real_open = Path.mkdir, open

    def under(path) -> bool:
        return os.path.abspath(path) == str(folder) or os.path.abspath(path).startswith(str(folder) + os.sep)

    def mkdir(self, *a, **k):
        if under(self):
            if self.is_dir() and k.get("exist_ok"):
                return None
            refused.append(str(self))
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **k)

    def fake_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and under(file):
            refused.append(str(file))
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(cache_file, "open", fake_open, raising=False)
    monkeypatch.setattr(sample_index, "open", fake_open, raising=False)
    return refused


@pytest.mark.parametrize("folder_exists", [False, True])
def test_an_index_cache_on_a_read_only_mount_names_the_folder_and_the_ways_out(ro_corpus, tmp_path, monkeypatch,
                                                                                folder_exists):
    """Reviewer fault 3: a corpus on a read-only mount without a prebuilt index stopped training with a bare
    `OSError: [Errno 30] Read-only file system: '.../index_cache'`. Now the error (CacheNotWritable, an OSError) names
    the folder, data.cache_dir and the command that prebuilds the index; with data.cache_dir on a writable folder the
    same corpus trains.

    The read-only mount is faked (tests run as root, whom chmod does not stop): Path.mkdir and the cache writers'
    open() under the corpus folder raise EROFS. The fake cannot see writes made any other way (os.open, np.memmap
    in a write mode, a library's own open); the build stops at its first refused write, which is one of the faked
    ones, as the traceback of the reviewer's real read-only mount showed."""
    from trainer.config import load_config
    from trainer.data.dataset import build_indexes, cache_policy

    corpus = tmp_path / "mnt"
    shutil.copytree(ro_corpus.parent, corpus)
    prefix = corpus / ro_corpus.name
    if folder_exists:
        (corpus / "index_cache").mkdir()
    refused = _read_only(monkeypatch, corpus)
    cfg = load_config("tiny_bert", [f"data.corpora=[{{prefix: {prefix}}}]"])
    with pytest.raises(OSError) as err:
        build_indexes(cfg.data, "train", cache_policy(cfg.data))
    msg = str(err.value)
    assert err.value.errno == errno.EROFS and refused
    assert f"the cache folder {corpus / 'index_cache'} is not writable" in msg, msg
    assert "data.cache_dir" in msg and "python -m trainer.data.build_index --config" in msg
    assert type(err.value).__name__ == "CacheNotWritable"
    writable = tmp_path / "cache"
    cfg = load_config("tiny_bert", [f"data.corpora=[{{prefix: {prefix}}}]", f"data.cache_dir={writable}"])
    (corpus_read, index), = build_indexes(cfg.data, "train", cache_policy(cfg.data))
    assert len(index) > 0 and list(writable.glob("index-*.bfc"))


def test_other_errors_of_an_index_build_keep_their_own_message(tmp_path):
    """Only a refused write into the cache folder becomes CacheNotWritable: a build's other OSErrors (an unreadable
    shard elsewhere) are raised as they were."""
    from trainer.data.cache_file import CachePolicy, ensure

    def build(path):
        raise OSError(errno.EACCES, "Permission denied", str(tmp_path / "corpus" / "c_00000.bin"))

    with pytest.raises(OSError) as err:
        ensure(tmp_path / "cache" / "x.bfc", "sample-index", "k", build, CachePolicy(tmp_path / "cache"), "x")
    assert type(err.value) is PermissionError and "c_00000.bin" in str(err.value)
