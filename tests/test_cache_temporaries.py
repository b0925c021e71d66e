"""A cache builder removes the temporaries of builders that died on this machine, in this pid namespace, and only
those: a temporary named by host and pid alone was deleted by a builder in another container with the same host name
(pods sharing the node's network and a cache volume; its pid did not exist in the cleaner's namespace), or on a host
named like the cleaner's plus "-12", and the live builder then failed at its rename (found by review)."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from trainer.data import cache_file

REPO = Path(__file__).resolve().parents[1]


def test_only_this_machines_dead_builders_temporaries_are_removed(tmp_path):
    path = tmp_path / "index-x.bfc"
    # a builder killed mid-write on this machine leaves its temporary
    subprocess.run([sys.executable, "-c", "import os, sys\nfrom trainer.data import cache_file\n"
                    f"w = cache_file.CacheWriter({str(path)!r}, 'test', 'key', [('a', 'int64', ())])\n"
                    "os._exit(0)"], cwd=REPO, check=True)
    (dead,) = tmp_path.glob(f".{path.name}.tmp-*")
    host = socket.gethostname()
    # live builders elsewhere, whose pids mean nothing here: another container with this host name, another host
    # named "<this host>-12" (the pid after the host name would parse as 12)
    other_container = tmp_path / f".{path.name}.tmp-{host}-0badc0de-{4_000_001}-bbbbbbbb"
    other_host = tmp_path / f".{path.name}.tmp-{host}-12-{4_000_002}-cccccccc"
    for f in (other_container, other_host):
        f.write_bytes(b"partial")
    # a killed builder of the code before the machine was in the name (found by the upgrade review)
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                              check=True).stdout.strip()
    old_style = tmp_path / f".{path.name}.tmp-{host}-{dead_pid}-deadbeef"
    old_style.write_bytes(b"partial")
    with cache_file.CacheWriter(path, "test", "key", [("a", "int64", ())]) as writer:
        assert not dead.exists() and not old_style.exists()
        assert other_container.exists() and other_host.exists()
        writer.abort()


def test_a_cache_file_under_another_key_is_named_when_this_one_is_missing(tmp_path, capsys):
    """After an upgrade (the key covers the code that builds a file) every sample index is built anew beside the
    old one; with data.require_prebuilt_index the run said the file "is missing" although one of its kind was there
    (found by the upgrade review). The message, and the build's note, name the file under the other key."""
    import pytest

    def build(path):
        with cache_file.CacheWriter(path, "sample-index", path.name, [("a", "int64", ())]) as w:
            w.append("a", __import__("numpy").arange(3))
            w.commit()

    cache = tmp_path / "cache"
    old = cache / "index-c-full-sentences-0123456789abcdef.bfc"
    cache_file.ensure(old, "sample-index", old.name, build, cache_file.CachePolicy(cache), "the sample index")
    new = cache / "index-c-full-sentences-fedcba9876543210.bfc"
    with pytest.raises(FileNotFoundError, match=r"is missing \(the same kind of file exists under another key: "
                                                r"index-c-full-sentences-0123456789abcdef.bfc"):
        cache_file.ensure(new, "sample-index", new.name, build,
                          cache_file.CachePolicy(cache, prebuilt_only=True), "the sample index")
    cache_file.ensure(new, "sample-index", new.name, build, cache_file.CachePolicy(cache), "the sample index")
    assert "remove the others once no run uses them" in capsys.readouterr().err
