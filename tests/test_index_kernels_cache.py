"""The compiled index walk where numba cannot cache it (trainer/data/index_kernels.py): a read-only checkout and a
read-only HOME (code in a container image, home directories not writable on compute nodes) made numba raise "cannot
cache function ...: no locator available" and failed every index build with a shard of COMPILE_FROM+ sentences.
Found by review (F6)."""
import errno

import numpy as np

from trainer.data import index_kernels


def test_an_unwritable_numba_cache_compiles_without_it_and_warns(monkeypatch, capsys):
    """Every cache location numba tries refuses a write (its ``ensure_cache_path``, as on a read-only mount: as root
    the test cannot make a real folder unwritable without a mount, which is what it does not see); the compiled walk
    still works and matches the Python one, with one warning naming NUMBA_CACHE_DIR."""
    from numba.core import caching

    def refuse(self):
        raise OSError(errno.EROFS, "Read-only file system", self.get_cache_path())

    monkeypatch.setattr(caching._CacheLocator, "ensure_cache_path", refuse)
    for name in ("mix1", "target1", "nsp1", "cost1", "walk", "pack"):  # _compiled rebinds them: restored after
        monkeypatch.setattr(index_kernels, name, getattr(index_kernels, name))
    index_kernels._compiled.cache_clear()
    try:
        ns = index_kernels.kernels(index_kernels.COMPILE_FROM)
        x = np.uint64(12345)
        assert ns.mix1(x) == index_kernels._PYTHON.mix1(x)
    finally:
        index_kernels._compiled.cache_clear()
    err = capsys.readouterr().err
    assert err.count("warning: numba cannot cache the compiled index walk") == 1
    assert "NUMBA_CACHE_DIR" in err
