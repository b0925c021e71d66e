"""Python's UTF-8 mode for every entry point, whatever the locale.

Under a non-UTF-8 locale (``zh_CN.GB18030``, common on older Chinese clusters; ``en_US.ISO-8859-1``; ``LC_ALL=C``
with ``PYTHONUTF8=0``) Python opens text files and encodes file names with the locale's codec, and that broke us
in places we do not control: torch's inductor reads its own UTF-8 templates with it (megatron-core imports them, so
``build_indexed.py`` could not start, nor the trainer with ``model.compile`` on), the Rust ``tokenizers`` library
encodes ``str`` paths as UTF-8 (a tokenizer could not be saved at a non-ASCII path), and printing Chinese text
failed. Python 3.11 turns UTF-8 mode on by itself only for the C/POSIX locale.

``reexec_in_utf8_mode()`` runs in each command's ``if __name__ == "__main__"`` block, before ``main``: under such a
locale it replaces the process with the same command line (``sys.orig_argv``: ``-m`` and script runs alike) and
``PYTHONUTF8=1`` in its environment, which the children inherit (DataLoader workers, subprocesses). ``os.execv``
keeps the pid, open descriptors and environment, so torchrun, srun and mpirun, which track their ranks by pid,
see nothing; it happens before MPI or any process group is initialised. Cost: one more interpreter start (~50 ms
plus the imports the module did at its top). The Slurm templates export ``PYTHONUTF8=1``, so there it never runs.
"""
from __future__ import annotations

import codecs
import locale
import os
import sys

REEXEC_ENV = "BERTFAMILY_UTF8_REEXEC"  # set by the re-exec: never a second time (a loop if the flag did not take)


def needs_utf8_mode() -> bool:
    """True when Python is not in UTF-8 mode and the locale's preferred encoding is not UTF-8."""
    if sys.flags.utf8_mode:
        return False
    try:
        return codecs.lookup(locale.getpreferredencoding(False)).name != "utf-8"
    except LookupError:
        return True


def reexec_in_utf8_mode() -> None:
    """Replace this process with the same command in UTF-8 mode when ``needs_utf8_mode()`` (module docstring);
    otherwise return. Where it cannot (no interpreter path, an exec failure, a second try), one warning."""
    if not needs_utf8_mode():
        return
    encoding = locale.getpreferredencoding(False)
    if os.environ.get(REEXEC_ENV) or not sys.executable or not getattr(sys, "orig_argv", None):
        print(f"warning: the locale's encoding is {encoding}, not UTF-8, and Python's UTF-8 mode is off: reading and "
              "writing non-ASCII text or paths may fail; set PYTHONUTF8=1", file=sys.stderr, flush=True)
        return
    os.environ["PYTHONUTF8"] = "1"
    os.environ[REEXEC_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as err:
        print(f"warning: could not restart in UTF-8 mode under the {encoding} locale ({err}); set PYTHONUTF8=1",
              file=sys.stderr, flush=True)
