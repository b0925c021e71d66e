"""Derived whole-corpus arrays as cache files: written once under a temporary name, renamed, then memory-mapped.

Every per-sentence or per-sample array the trainer needs beyond the ``.idx`` files (the corpus's token offsets and
document starts, the sample index) lives in one of these files. All ranks and DataLoader workers of a node map the
same file, so the kernel keeps one copy in its page cache instead of one private copy per process (at 2B sentences
that is the difference between ~24 GB per rank and ~0 private bytes).

Layout (little-endian)::

    0      8 bytes    magic b"BFCACHE\\0"
    8      4 bytes    n = length of the JSON header
    12     n bytes    JSON header: {"version", "kind", "key", "size", "arrays": [{"name", "dtype", "shape",
                      "offset"}], "meta": {...}}
    12+n   32 bytes   sha256 of the JSON header bytes
    ...    padding up to HEADER_SPACE (4096): arrays start there, each at a 64-byte aligned offset

``open_cache`` checks the magic, the header checksum, the format version, the expected key (the hash of every
setting the arrays depend on) and the file size against the header: a truncated, foreign or stale file is reported
(and rebuilt by ``ensure``), never read. The array bytes themselves are not checksummed (reading 10 GB to check them
would cost what mapping saves); they are written before the rename, so a file under the final name is complete.

Coordination without ``flock`` (Lustre mounted ``noflock`` raises; ``localflock`` locks per node only): the builder
(global rank 0, or any process started without a launcher) writes ``.NAME.tmp-HOST-PID-RANDOM`` and renames it to
``NAME`` (atomic on POSIX filesystems, Lustre and NFS included); the other ranks poll for a valid ``NAME`` up to
``timeout`` seconds. Two builders racing (two jobs on one cache) both rename complete, identical files: the last
rename wins and readers that mapped the first keep a valid inode. A builder killed mid-write leaves only its
temporary file (removed by the next builder on the same host) and no final file, so a rerun builds again. A builder
whose build raises leaves ``NAME.failed.json`` (its error, rank, host and launch id) before re-raising; waiting ranks
of the same launch check for it at every poll (at most 2 s apart) and stop with that error (``BuildFailed``) instead
of waiting out ``timeout`` (1 h by default). The next builder removes it before building.

Names: a cache file's name holds its corpus's name (``index-NAME-FORMAT-KEY.bfc``), and its temporaries and failure
note add ~60 bytes plus the host name to it. Where that passes ``NAME_MAX`` (255 bytes: a 200-byte corpus name), they
are named after the file's first bytes and a hash of its whole name instead (``fit_name``), since ENAMETOOLONG after
the corpus was built was a raw traceback (found by review); ``build_indexed`` refuses a corpus name whose cache files
themselves would not fit (data_prep/prefix_names.py).

A builder that cannot write the cache folder (a corpus on a read-only mount with the default ``index_cache/`` beside
it, a folder without write permission) stops with ``CacheNotWritable``: the folder, ``data.cache_dir`` and the
command that prebuilds the file, instead of a bare ``OSError``.
"""
from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import socket
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Callable

import numpy as np

MAGIC = b"BFCACHE\0"
FORMAT_VERSION = 1
HEADER_SPACE = 4096
ALIGN = 64


NAME_MAX = 255
"""The longest file name, in bytes, on Linux filesystems (ext4, XFS, Lustre, NFS, most FUSE mounts)."""


def fit_name(name: str, extra: int) -> str:
    """``name``, or, when ``name`` and ``extra`` more bytes would pass ``NAME_MAX``, its first bytes, ``~`` and 16 hex
    digits of its hash: what the temporaries and notes of a file with a long name are named after. The hash keeps
    two long names with one beginning apart."""
    raw = os.fsencode(name)
    if len(raw) + extra <= NAME_MAX:
        return name
    head = os.fsdecode(raw[:max(0, NAME_MAX - extra - 17)])  # a cut UTF-8 character stays these bytes (surrogates)
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:16]}"


class CacheInvalid(Exception):
    """The file exists but cannot be used (truncated, foreign, another key); the message says why."""


def settings_hash(settings: dict) -> str:
    """The cache key of a cache file: a short hash of the JSON of everything that defines its content."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def code_hash(paths) -> str:
    """A short sha256 of the source files that lay a cache file out (``paths``, in order): part of its key, so a
    shared ``cache_dir`` never serves a file written by another checkout's code. Any edit of those files (a comment
    too) makes the next run build again; the hand-bumped ``*_VERSION`` constants say when a change is meant to."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(_file_digest(str(path)))
    return digest.hexdigest()[:16]


_FILE_DIGESTS: dict = {}


def _file_digest(path: str) -> bytes:
    st = os.stat(path)
    stamp = (path, st.st_size, st.st_mtime_ns)
    if stamp not in _FILE_DIGESTS:
        with open(path, "rb") as f:
            _FILE_DIGESTS[stamp] = hashlib.sha256(f.read()).digest()
    return _FILE_DIGESTS[stamp]


def launcher_rank() -> int:
    """This process's global rank from the launcher's environment (torchrun/deepspeed, MPI, PMI), else 0."""
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


@dataclass
class CachePolicy:
    """Where cache files live and who builds them (DataConfig fields: cache_dir, index_wait_timeout,
    require_prebuilt_index, index_workers, index_memory_gb)."""

    dir: Path
    builder: bool = True
    timeout: float = 3600.0
    prebuilt_only: bool = False
    workers: int = 1
    memory: int | None = None
    """bytes a sample-index build may hold in flight (None: sample_index.BUILD_MEMORY); data.index_memory_gb"""
    hint: str = "python -m trainer.data.build_index --config RECIPE"
    """the command that builds the cache ahead of a job, printed in errors"""


class CacheNotWritable(OSError):
    """The builder cannot write the cache folder (read-only filesystem, no permission); the message names the folder,
    ``data.cache_dir`` and the command that prebuilds the file."""


_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _not_writable(err: BaseException, path: Path, what: str, policy: CachePolicy) -> CacheNotWritable | None:
    """``err`` as ``CacheNotWritable`` when it is a refused write into ``path``'s folder (or the making of that folder
    or of one above it), else None: other errors of a build (an unreadable shard) keep their own message."""
    if not isinstance(err, OSError) or err.errno not in _NOT_WRITABLE or err.filename is None:
        return None
    folder = os.path.abspath(path.parent)
    target = os.path.abspath(os.fsdecode(err.filename))
    if not (target == folder or target.startswith(folder + os.sep) or folder.startswith(target + os.sep)):
        return None
    return CacheNotWritable(
        err.errno,
        f"cannot build {what}: the cache folder {folder} is not writable ({err.strerror}: {target}), and the file "
        f"{path.name} is not there prebuilt. Put the cache on a writable filesystem with data.cache_dir (e.g. --set "
        f"data.cache_dir=/scratch/$USER/bertfamily-cache; by default it is index_cache/ beside the first corpus), "
        f"or prebuild it, with this run's settings, where that folder is writable:\n    {policy.hint}")


class BuildFailed(RuntimeError):
    """The builder rank failed to build a cache file that this rank waits for; the message holds the builder's error."""


def launch_id() -> str:
    """What identifies this launch of the job to all of its ranks (and to no other launch): the launcher's run id,
    Slurm's job and step, or the rendezvous address; "" when started without a launcher."""
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun:" + env["TORCHELASTIC_RUN_ID"] + ":" + env.get("TORCHELASTIC_RESTART_COUNT", "0")
    # an MPI job's id before Slurm's step: under mpirun in an allocation, the ranks on the batch host run in the
    # batch step and the others in the step of the srun that started their daemons (found by review)
    mpi = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
    if mpi:
        return f"mpi:{mpi}" + (f":slurm:{env['SLURM_JOB_ID']}" if env.get("SLURM_JOB_ID") else "")
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}:{env.get('SLURM_RESTART_COUNT', '0')}"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"rdzv:{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return ""


def failure_note_path(path: str | os.PathLike) -> Path:
    """Where a failed builder leaves its error for the ranks waiting on ``path``: ``NAME.failed.json``."""
    path = Path(path)
    return path.with_name(fit_name(path.name, len(".failed.json")) + ".failed.json")


def _write_failure_note(note: Path, key: str, what: str, err: BaseException) -> None:
    """Best effort: the waiting ranks stop within seconds with this error instead of waiting out
    ``data.index_wait_timeout``. Written atomically (temporary name, rename), as the cache files are."""
    text = json.dumps({"key": key, "what": what, "launch": launch_id(), "rank": launcher_rank(),
                       "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
                       "error": f"{type(err).__name__}: {err}"})
    tail = f".tmp-{socket.gethostname()}-{os.getpid()}"
    tmp = note.with_name(f".{fit_name(note.name, 1 + len(os.fsencode(tail)))}{tail}")
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, note)
    except OSError:
        tmp.unlink(missing_ok=True)


def _read_failure_note(note: Path, key: str, waited_from: float) -> dict | None:
    """The builder's failure note if it is about this key and this launch: the same launch id, or without a launcher
    id, a note written after this rank began to wait (on a shared filesystem the file's time is the server's, so
    allow 60 s of clock difference). A note of an earlier launch is ignored (its builder removes it)."""
    try:
        found = json.loads(note.read_text())
        written = note.stat().st_mtime
    except (OSError, ValueError):
        return None
    if found.get("key") != key:
        return None
    mine = launch_id()
    if mine or found.get("launch"):
        return found if found.get("launch") == mine else None
    return found if written >= waited_from - 60 else None


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class CacheWriter:
    """Appends arrays, in the order declared, to a temporary file; ``commit`` writes the header and renames.

    Sizes need not be known in advance: ``append(name, part)`` streams an array in pieces of any length (rows for 2-D
    arrays), so a builder never holds a whole array. Use as a context manager: an exception removes the temporary.
    """

    def __init__(self, path: str | os.PathLike, kind: str, key: str, arrays: list[tuple[str, str, tuple]]):
        self.path = Path(path)
        if len(os.fsencode(self.path.name)) > NAME_MAX:  # a corpus built before build_indexed refused such names
            raise OSError(errno.ENAMETOOLONG, f"cannot write the cache file {self.path.name}: its name is "
                          f"{len(os.fsencode(self.path.name))} bytes, more than filesystems allow ({NAME_MAX}, "
                          "NAME_MAX). It holds the corpus's name: rebuild the corpus under a shorter --output-prefix "
                          "name (build_indexed now refuses such a name, saying how long it may be)", str(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(self.path)
        self.tmp = self.path.parent / f"{_tmp_prefix(self.path)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.kind, self.key = kind, key
        # name -> [dtype, row shape (shape[1:]), rows written, offset]
        self._specs = {name: [np.dtype(dt), tuple(row), 0, None] for name, dt, row in arrays}
        self._order = [name for name, _, _ in arrays]
        self._current = -1
        self._f = open(self.tmp, "wb")
        self._f.truncate(HEADER_SPACE)
        self._f.seek(HEADER_SPACE)
        self.meta: dict = {}

    def append(self, name: str, part: np.ndarray) -> None:
        spec = self._specs[name]
        idx = self._order.index(name)
        if idx < self._current:
            raise RuntimeError(f"{name}: arrays must be written in the declared order {self._order}")
        while self._current < idx:  # start the next array at an aligned offset
            self._current += 1
            pos = _aligned(self._f.tell())
            self._f.seek(pos)
            self._specs[self._order[self._current]][3] = pos
        part = np.ascontiguousarray(part, dtype=spec[0])
        if part.shape[1:] != spec[1]:
            raise ValueError(f"{name}: rows of shape {part.shape[1:]}, declared {spec[1]}")
        if part.size:  # (memoryview cannot cast an empty 2-D view: a block with no samples)
            self._f.write(memoryview(part).cast("B"))  # no copy
        spec[2] += len(part)

    def commit(self, meta: dict | None = None) -> Path:
        for name in self._order[self._current + 1:]:  # arrays never appended are empty
            self.append(name, np.zeros((0,) + self._specs[name][1], self._specs[name][0]))
        size = self._f.seek(0, os.SEEK_END)
        arrays = [{"name": n, "dtype": self._specs[n][0].str, "shape": [self._specs[n][2], *self._specs[n][1]],
                   "offset": self._specs[n][3]} for n in self._order]
        header = json.dumps({"version": FORMAT_VERSION, "kind": self.kind, "key": self.key, "size": size,
                             "arrays": arrays, "meta": {**self.meta, **(meta or {})}}, sort_keys=True).encode()
        blob = MAGIC + len(header).to_bytes(4, "little") + header + hashlib.sha256(header).digest()
        if len(blob) > HEADER_SPACE:
            raise ValueError(f"{self.path}: header of {len(blob)} bytes exceeds {HEADER_SPACE}")
        self._f.seek(0)
        self._f.write(blob)
        self._f.flush()
        os.fsync(self._f.fileno())  # the data reaches the file before its name does
        self._f.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None or self.tmp.exists():
            self.abort()
        return False


def _tmp_prefix(path: Path) -> str:
    """``.NAME.tmp-HOST-MACHINE-``: a builder's temporaries name its host and, as a hash of the boot id and the pid
    namespace, the machine and container whose pids it can check (``_remove_stale_temporaries``)."""
    return "".join(_tmp_parts(path))


def _tmp_parts(path: Path) -> tuple[str, str]:
    """``_tmp_prefix`` as (``.NAME``, ``.tmp-HOST-MACHINE-``). A long NAME is cut and hashed (``fit_name``) so that the
    whole name, with the pid (up to 10 digits) and ``-RANDOM8`` after it, fits in ``NAME_MAX``."""
    from trainer.run_lock import _boot_id, _pid_ns
    machine = hashlib.sha256(f"{_boot_id()}/{_pid_ns()}".encode()).hexdigest()[:8]
    tail = f".tmp-{socket.gethostname()}-{machine}-"
    return "." + fit_name(path.name, 1 + len(os.fsencode(tail)) + 10 + 9), tail


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of builders that died on this machine, in this pid namespace (their pid is gone). Others are left
    alone: another host's, and another container's with this host name (pods sharing the node's network and a cache
    volume), whose pids mean nothing here; before the machine was in the name, such a live temporary was deleted and
    its builder failed at the rename. A host named like this one plus ``-N`` cannot match either.

    Temporaries named before the machine was (``.NAME.tmp-HOST-PID-XXXXXXXX``, by builders of the code before
    2026-12-05) are judged by host and pid as they were then: else a killed old builder's gigabytes stayed forever."""
    stem, tail = _tmp_parts(path)  # stem: .NAME, or .CUT~HASH for a long one
    prefix = stem + tail
    old = re.compile(rf"\.{re.escape(path.name)}\.tmp-{re.escape(socket.gethostname())}-(\d+)-[0-9a-f]{{8}}")
    for tmp in path.parent.glob(f"{glob_escape(stem)}.tmp-*"):
        try:
            if tmp.name.startswith(prefix):
                pid = int(tmp.name[len(prefix):].split("-")[0])
            elif old.fullmatch(tmp.name):
                pid = int(old.fullmatch(tmp.name).group(1))
            else:
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError, OSError):
            pass


def read_header(path: str | os.PathLike) -> dict:
    """The checked header of a cache file; raises ``CacheInvalid`` (why) or ``FileNotFoundError``."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_SPACE)
        size = f.seek(0, os.SEEK_END)
    if len(head) < 12 or head[:8] != MAGIC:
        raise CacheInvalid(f"{path}: not a bertfamily cache file (bad magic)")
    n = int.from_bytes(head[8:12], "little")
    if 12 + n + 32 > len(head):
        raise CacheInvalid(f"{path}: truncated header")
    header_bytes, digest = head[12:12 + n], head[12 + n:12 + n + 32]
    if hashlib.sha256(header_bytes).digest() != digest:
        raise CacheInvalid(f"{path}: header checksum mismatch (corrupt or partly written)")
    header = json.loads(header_bytes)
    if header.get("version") != FORMAT_VERSION:
        raise CacheInvalid(f"{path}: cache format version {header.get('version')}, this code reads {FORMAT_VERSION}")
    if size != header["size"]:
        raise CacheInvalid(f"{path}: {size} bytes, the header says {header['size']} (truncated)")
    return header


def open_cache(path: str | os.PathLike, kind: str, key: str) -> tuple[dict[str, np.ndarray], dict]:
    """Map a cache file read-only -> ({name: array view of the map}, meta). Raises ``CacheInvalid`` or
    ``FileNotFoundError``. The arrays are plain ndarrays whose ``.base`` chain ends at the ``mmap.mmap``."""
    path = Path(path)
    header = read_header(path)
    if header.get("kind") != kind or header.get("key") != key:
        raise CacheInvalid(f"{path}: holds {header.get('kind')} {header.get('key')}, expected {kind} {key} "
                           "(a foreign file under this name)")
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the descriptor
    arrays = {}
    for a in header["arrays"]:
        dtype, shape = np.dtype(a["dtype"]), tuple(a["shape"])
        count = int(np.prod(shape))
        if count == 0:  # an empty array may start past the last byte
            arrays[a["name"]] = np.zeros(shape, dtype)
        else:
            arrays[a["name"]] = np.frombuffer(mm, dtype=dtype, count=count, offset=a["offset"]).reshape(shape)
    return arrays, header["meta"]


def is_mapped(arr: np.ndarray) -> bool:
    """True if ``arr`` is a view of a memory map (its ``.base`` chain ends at an ``mmap.mmap``), not private."""
    base = arr
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer keeps a memoryview of the buffer it was given
        base = base.obj
    return isinstance(base, (mmap.mmap, np.memmap))


def _other_keys(path: Path) -> list[Path]:
    """Cache files of the same kind and source as ``path`` under other keys (``NAME-<key>.bfc`` siblings)."""
    stem, _, rest = path.name.rpartition("-")
    if not stem or not rest.endswith(".bfc"):
        return []
    return sorted(p for p in path.parent.glob(f"{glob_escape(stem)}-*.bfc")
                  if p != path and re.fullmatch(r"[0-9a-f]+\.bfc", p.name[len(stem) + 1:]))


def ensure(path: str | os.PathLike, kind: str, key: str, build: Callable[[Path], None], policy: CachePolicy,
           what: str) -> tuple[dict[str, np.ndarray], dict]:
    """The mapped cache file, built first if missing or invalid (see the module docstring for who builds).

    ``build(path)`` must write ``path`` with a ``CacheWriter``. ``what`` names the file's content in messages."""
    path = Path(path)
    try:
        return open_cache(path, kind, key)
    except FileNotFoundError:
        reason = None
    except CacheInvalid as err:
        reason = str(err)
        warnings.warn(f"{reason}: rebuilding {what}", stacklevel=2)
    others = _other_keys(path)
    superseded = (f" (the same kind of file exists under another key: {', '.join(p.name for p in others[:3])}: built "
                  "for other settings or by other code; the key covers the corpus, the settings and the code that "
                  "builds it, so a change of any, an upgrade included, builds anew)") if others else ""
    if policy.prebuilt_only:
        raise FileNotFoundError(
            f"{what} {path} is {'missing' if reason is None else 'invalid: ' + reason}{superseded} and "
            f"data.require_prebuilt_index is set: build it before the job with\n    {policy.hint}")
    note = failure_note_path(path)
    if policy.builder and others and reason is None:
        print(f"building {what} {path.name}{superseded}; remove the others once no run uses them", file=sys.stderr,
              flush=True)
    if policy.builder:
        note.unlink(missing_ok=True)  # an earlier launch's failure is not this one's
        try:
            build(path)
        except BaseException as err:
            clear = _not_writable(err, path, what, policy)
            _write_failure_note(note, key, what, clear or err)
            if clear is not None:
                raise clear from err
            raise
        return open_cache(path, kind, key)
    deadline = time.monotonic() + policy.timeout
    waited_from = time.time()
    delay = 0.2
    while True:
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
        failed = _read_failure_note(note, key, waited_from)
        if failed is not None:
            raise BuildFailed(f"rank {failed.get('rank', 0)} ({failed.get('host')}) failed to build {what} {path}: "
                              f"{failed.get('error')}")
        try:
            return open_cache(path, kind, key)
        except (FileNotFoundError, CacheInvalid) as err:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {policy.timeout:.0f} s (data.index_wait_timeout) for {what} {path}, which rank 0 builds "
                    f"({err}). If rank 0 failed, its log says why; if data.cache_dir is not shared by all nodes, "
                    f"point it at a shared folder. Or build it before the job with\n    {policy.hint}") from None
