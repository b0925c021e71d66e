"""Tokenize a corpus into megatron-core indexed shards plus a manifest: streaming, parallel, restartable.

    python data_prep/build_indexed.py --input DIR_OR_FILES_OR_GLOBS --tokenizer TOK_DIR --output-prefix OUT/corpus \
        [--workers N] [--split-sentences] [--json-key text] [--chunk-size-mb MB] [--shard-size-mb 512]

Output: ``OUT/corpus_00000.bin/.idx``, ... (megatron-core ``IndexedDatasetBuilder``: one sequence per sentence, or per
line without --split-sentences, ``end_document`` per document) and ``OUT/corpus.manifest.json`` (data_prep/manifest.py).

How the work is cut, so that the output depends only on the inputs and the settings:
- The unit of work is a *piece*: an uncompressed input is cut into ~--chunk-size-mb byte ranges at document
  boundaries (sources.piece_bounds), a compressed input is one piece, consecutive inputs smaller than a piece are
  grouped into one (prep_work.plan_pieces: shards follow the bytes, not the file count). Pieces are numbered in
  input order. Without --chunk-size-mb the size follows from the total input size (prep_work.auto_chunk_bytes: ~64
  pieces of 4-256 MB), never from the worker count, so the same inputs give the same pieces on any machine.
- Piece i becomes shards ``work/piece_{i}-{k}`` in the work folder ``PREFIX.work/``, a new shard starting whenever
  one would pass --shard-size-mb of tokens or --shard-sequences sequences (megatron's .idx finalize holds every
  sequence length of a shard in Python lists, ~70 bytes each, so shards, not the corpus, bound memory). When its
  shards are finished and fsynced, a record ``piece_{i}.json`` (counts, sha256) is written atomically: the record is
  what says "done".
- Rank r of R takes the pieces with i % R == r; within a rank, --workers processes take them from a pool.
- After every rank is done (an MPI allgather, which is also the barrier), rank 0 numbers the shards in piece order,
  renames them to their final names ``PREFIX_00000``... (``os.replace``: a final name never holds a partial file),
  writes the manifest (atomically, last) and removes the work folder.

Restart: run the same command again. Pieces with a record whose files still match their sha256 are skipped; the
rest are redone from their start; the result is byte-identical to an uninterrupted run. A work folder made with
other settings, inputs or tokenizer stops the run (rerun with --overwrite to discard it). A finished output whose
manifest matches the command is left alone, even beside another command's unfinished work folder (reported, kept
until that command is rerun, or discarded by --overwrite); a finished corpus stays usable while another command's
run is under way, and is replaced only by that run's finalize.

One run per output prefix at a time (data_prep/prep_lock.py): rank 0 holds ``OUT/.NAME.lock/`` from before the
up-to-date check to its exit; a second launch on the same prefix is refused naming the live holder (two runs would
write the same work files), and the lock of a run that died is taken over (--lock-stale-s).

MPI: launched by ``mpirun``/``srun`` (detected from OMPI_COMM_WORLD_SIZE, PMI_SIZE or a Slurm step with several
tasks), ranks split the pieces; mpi4py is imported only then, after the worker pool is gone (forking an initialised
MPI process is unsafe). Bad input: see data_prep/sources.py (counted by reason in the summary and the manifest, or
stopping the run naming the file); a run that lost over --max-bad-share of its records stops before its manifest
(data_prep/bad_input.py).
"""
from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python data_prep/build_indexed.py`: make `data_prep` importable
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
import warnings
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from itertools import chain
from pathlib import Path

import numpy as np

from data_prep import manifest as mf
from data_prep import bad_input, build_indexed_args, prep_lock, sources
from data_prep.mpi_world import detect_world, mpi_allgather as _mpi_allgather  # noqa: F401 (re-exported)
from data_prep.prep_work import (Piece, Settings, World, auto_chunk_bytes, finalize, finished_pieces, piece_bytes,
                                 piece_documents, plan_identity, plan_pieces, prepare_workdir, record_name,
                                 same_unfinished_run, up_to_date, write_json_atomic)
from data_prep.sentences import split_sentences

BATCH_TEXTS = 4096  # texts per encode_batch call: large enough that Rust does the work, small enough for memory
BATCH_BYTES = 1 << 20
MAX_WARNINGS_PER_REASON = 5
KILL_HOOK = "BERTFAMILY_PREP_KILL_AFTER_PIECES"  # tests: SIGKILL this process after it finished N pieces


class WorkerDied(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------- the work


class _ShardWriter:
    """The shards of one piece, each a megatron-core IndexedDatasetBuilder, rotated at the size limits."""

    def __init__(self, workdir: Path, piece: int, settings: Settings):
        self.workdir, self.piece, self.settings = workdir, piece, settings
        self.dtype = np.dtype(settings.dtype)
        self.shards: list[dict] = []
        self.documents_by_input: Counter = Counter()  # a group of inputs: its record says which made what
        self._builder = None

    def add_document(self, tokens: np.ndarray, lengths: list[int]) -> None:
        if self._builder is not None and (
            self._bin_bytes + tokens.nbytes > self.settings.shard_bytes
            or self._sequences + len(lengths) > self.settings.shard_sequences
        ):
            self._finish()
        if self._builder is None:
            self._start()
        self._builder.add_document(tokens, lengths)
        self._documents += 1
        self._sequences += len(lengths)
        self._tokens += int(tokens.size)
        self._bin_bytes += tokens.nbytes

    def _start(self) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self._name = f"piece_{self.piece:06d}-{len(self.shards):03d}"
        self._builder = IndexedDatasetBuilder(str(self.workdir / (self._name + ".bin")), dtype=self.dtype.type)
        self._documents = self._sequences = self._tokens = self._bin_bytes = 0

    def _finish(self) -> None:
        bin_path, idx_path = self.workdir / (self._name + ".bin"), self.workdir / (self._name + ".idx")
        self._builder.finalize(str(idx_path))
        self._builder = None
        for path in (bin_path, idx_path):  # durable before the record says "done"
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        self.shards.append({
            "work_name": self._name, "documents": self._documents, "sentences": self._sequences,
            "tokens": self._tokens, "bin_bytes": bin_path.stat().st_size,
            "bin_sha256": mf.sha256_file(bin_path), "idx_sha256": mf.sha256_file(idx_path),
        })

    def close(self) -> list[dict]:
        if self._builder is not None:
            self._finish()
        return self.shards


class _Worker:
    """Per-process state: the tokenizer and the shared progress counters."""

    def __init__(self, tokenizer_dir: str, settings: Settings, workdir: Path, counters, threads: int):
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))  # before the first encode_batch builds the pool
        from data_prep.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.settings, self.workdir, self.counters = settings, workdir, counters
        self.warned: Counter = Counter()
        self.finished = 0

    def on_skip(self, reason: str, where: str) -> None:
        self.warned[reason] += 1
        if self.warned[reason] <= MAX_WARNINGS_PER_REASON:
            more = " (further ones are only counted)" if self.warned[reason] == MAX_WARNINGS_PER_REASON else ""
            print(f"warning: skipped ({reason}): {where}{more}", file=sys.stderr, flush=True)

    def _progress(self, nbytes: int, docs: int) -> None:
        with self.counters[0].get_lock():
            self.counters[0].value += nbytes
            self.counters[1].value += docs

    def build(self, piece: Piece) -> dict:
        s = self.settings
        skipped: Counter = Counter()
        writer = _ShardWriter(self.workdir, piece.index, s)
        dtype = np.dtype(s.dtype)
        skipped_by_input: list[Counter] = []
        docs = piece_documents(piece, skipped, skipped_by_input, json_key=s.json_key, on_skip=self.on_skip,
                               max_line_bytes=s.max_line_bytes, max_document_bytes=s.max_document_bytes)
        # Progress in input bytes: uncompressed pieces report as they go (document offsets are file offsets);
        # compressed files and pydocs report their size when the piece ends.
        batch, texts, nbytes, mark = [], 0, 0, piece.start
        by_offset = sources.is_splittable(piece.path) and piece.path != sources.PYDOCS and not piece.more
        for doc in chain(docs, [None]):
            if doc is not None:
                batch.append(doc)
                texts += len(doc.lines)
                nbytes += sum(len(x) for x in doc.lines)
                if texts < BATCH_TEXTS and nbytes < BATCH_BYTES:
                    continue
            if batch:
                self._encode_batch(batch, writer, dtype, skipped)
                advance = doc.offset - mark if by_offset and doc is not None else 0
                self._progress(advance, len(batch))
                mark += advance
            batch, texts, nbytes = [], 0, 0
        shards = writer.close()
        self._progress(piece_bytes(piece) - (mark - piece.start), 0)
        record = {"piece": piece.as_record(), "shards": shards, "skipped": dict(sorted(skipped.items()))}
        if piece.more:  # per input, in order: the manifest's input_documents, and bad input by file
            record["input_documents"] = [writer.documents_by_input[p] for p in piece.paths]
            record["input_skipped"] = [dict(sorted(c.items())) for c in skipped_by_input]
        write_json_atomic(self.workdir / record_name(piece.index), record)
        self.finished += 1
        if os.environ.get(KILL_HOOK) and self.finished >= int(os.environ[KILL_HOOK]):
            os.kill(os.getpid(), signal.SIGKILL)
        return record

    def _encode_batch(self, batch, writer: _ShardWriter, dtype, skipped: Counter) -> None:
        if self.settings.split_sentences:
            per_doc = [[s for line in doc.lines for s in split_sentences(line)] for doc in batch]
        else:
            per_doc = [doc.lines for doc in batch]
        texts = [t for doc in per_doc for t in doc]
        ids = self.tokenizer.encode_batch(texts)
        lengths = [len(x) for x in ids]
        flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=sum(lengths))
        first = pos = 0
        for doc, sents in zip(batch, per_doc):
            lens = lengths[first: first + len(sents)]
            first += len(sents)
            total = sum(lens)
            if 0 in lens:  # text the tokenizer maps to nothing (control characters, lone marks): no empty sequences
                skipped["no_tokens"] += lens.count(0)
                lens = [n for n in lens if n]
            if not lens:
                skipped["empty_document"] += 1
                continue
            writer.add_document(flat[pos: pos + total], lens)
            writer.documents_by_input[doc.source] += 1
            pos += total


_WORKER: _Worker | None = None


def _init_worker(*args) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the parent, which terminates the pool
    _WORKER = _Worker(*args)


def _die_with_parent(parent: int) -> None:
    """Linux: ask the kernel to SIGKILL this pool worker when the process that forked it dies. A parent killed by
    SIGTERM or SIGKILL runs no cleanup, and its workers, blocked reading the pool's pipe, would otherwise live on
    forever. Losing a worker mid-piece loses nothing finished: a piece counts as done only once its record is written
    (atomically), and a rerun redoes the rest. Elsewhere (no prctl) this does nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _init_pool_worker(parent: int, *args) -> None:
    _die_with_parent(parent)
    _init_worker(*args)


def _build_in_worker(piece: Piece) -> dict:
    return _WORKER.build(piece)


# ---------------------------------------------------------------------------------------------------- plan, restart


def _import_builder() -> None:
    """megatron-core's builder, without its warnings about missing Transformer Engine/Apex (irrelevant here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.datasets.indexed_dataset  # noqa: F401


def _run_pieces(todo: list[Piece], args, settings: Settings, workdir: Path, world: World, total_bytes: int) -> None:
    from tqdm import tqdm

    counters = (mp.Value("q", 0), mp.Value("q", 0))
    from data_prep.cpus import usable_cpus

    cpus = usable_cpus()  # Slurm's allocation (cgroup/affinity), not the node's
    threads = args.tokenizer_threads or max(1, cpus // (args.workers * max(1, world.local_size)))
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, disable=world.rank != 0,
               desc=f"rank 0/{world.size}" if world.is_mpi else "tokenizing", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 10)
    t0 = time.time()

    def refresh():
        bar.n = counters[0].value
        docs = counters[1].value
        bar.set_postfix_str(f"{docs / max(time.time() - t0, 1e-9):,.0f} docs/s", refresh=False)
        bar.refresh()

    init = (args.tokenizer, settings, workdir, counters, threads)
    try:
        if args.workers == 1:
            _init_worker(*init)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for piece in todo:
                _build_in_worker(piece)
                refresh()
        else:
            # fork: workers inherit the imported megatron-core (3 s each to import again) and the counters. MPI is
            # not initialised yet (see _mpi_allgather), so forking is safe. ProcessPoolExecutor, not Pool: a worker
            # killed by the OOM killer breaks the executor (an error here) where Pool would wait for it forever.
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_init_pool_worker,
                                     initargs=(os.getpid(), *init)) as pool:
                pending = {pool.submit(_build_in_worker, p) for p in todo}
                try:
                    while pending:
                        finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            fut.result()  # re-raises a worker's error here
                        refresh()
                except BrokenProcessPool as err:
                    raise WorkerDied("a worker process died (killed, or out of memory?); finished pieces are "
                                     "kept") from err
                except BaseException:
                    for fut in pending:
                        fut.cancel()
                    raise
        refresh()
    finally:
        bar.close()


def parse_args(argv=None) -> argparse.Namespace:
    return build_indexed_args.parse_args(argv, __doc__)


def main(argv=None) -> int:
    args = parse_args(argv)
    world = detect_world()
    from data_prep.tokenizer import load_tokenizer

    t0 = time.time()
    tokenizer = load_tokenizer(args.tokenizer)
    if args.annotate:  # a bad spec fails now, not after the corpus is tokenized
        from data_prep.annotate import make_annotator

        try:
            make_annotator(args.annotate)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if args.annotate.split(":")[0] == "jieba":  # its cache folder: an unwritable one is warned now, not later
            from data_prep.annotators import jieba_cache_folder
            jieba_cache_folder()
    dir_skips: Counter = Counter()
    say = print if world.rank == 0 else (lambda *a, **k: None)
    prefix = args.output_prefix
    workdir = Path(prefix + ".work")
    own_outputs: list[str] = []
    mb = 1 << 20
    try:
        inputs = sources.expand_inputs(args.input, dir_skips, lambda r, w: say(f"warning: skipped ({r}): {w}",
                                                                              file=sys.stderr),
                                       output_prefix=prefix, excluded=own_outputs)
        if own_outputs:
            say(f"note: {len(own_outputs)} file(s) or folder(s) of this command's own output ({prefix}.manifest.json, "
                f"{prefix}_*, {prefix}.work/) lie under --input and are not read as input")
        for path in inputs:
            sources.check_readable(path)
        settings = Settings(
            json_key=args.json_key, split_sentences=args.split_sentences,
            chunk_bytes=(int(args.chunk_size_mb * mb) if args.chunk_size_mb is not None
                         else auto_chunk_bytes(sum(sources.input_bytes(p) for p in inputs))),
            shard_bytes=int(args.shard_size_mb * mb), shard_sequences=args.shard_sequences,
            max_line_bytes=int(args.max_line_mb * mb), max_document_bytes=int(args.max_document_mb * mb),
            dtype="uint16" if tokenizer.vocab_size < 65500 else "int32",
        )
        pieces = plan_pieces(inputs, settings)
        identity = plan_identity(inputs, settings, tokenizer, pieces)
        note = bad_input.one_piece_note(inputs, pieces, settings.chunk_bytes, args.workers * world.size)
        if note:
            say(note, file=sys.stderr)
    except sources.InputError as err:  # an input vanished or became unreadable while the run was being planned
        print(f"error: {err}", file=sys.stderr)
        return 2
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    # One run per prefix (data_prep/prep_lock.py): held by rank 0 from before the up-to-date check to the end
    try:
        with prep_lock.holding(prefix, args.lock_stale_s, world.rank) as lock:
            if up_to_date(prefix, identity, tokenizer) and not same_unfinished_run(workdir, identity):
                say(f"{mf.manifest_path(prefix)} is up to date with this command; "
                    + (f"checking its side-cars for --annotate {args.annotate}" if args.annotate else
                       f"nothing to do (inspect it with data_prep/inspect_indexed.py {prefix})"))
                if args.annotate:  # finish an annotation that was interrupted, or add one (every rank its share)
                    if _annotate(prefix, args.annotate, args.workers, only_missing=True, world=world):
                        return 2
                if workdir.exists() and args.overwrite:
                    if world.rank == 0:
                        shutil.rmtree(workdir, ignore_errors=True)
                    say(f"--overwrite: discarded the unfinished run of another command in {workdir}")
                elif workdir.exists():
                    say(f"note: {workdir} holds an unfinished run of another command; it is left alone (rerun that "
                        f"command to finish it: its end replaces this corpus; or add --overwrite to this one to "
                        f"discard it)")
                return 0
            # The finished corpus at PREFIX (if any) stays usable while this run works in PREFIX.work/: its manifest is
            # removed only by finalize, just before the first shard is renamed over its files.
            prep_lock.wait_for_rank0(prefix, world.rank, args.lock_stale_s)  # ranks > 0: rank 0 holds it for us
            prepare_workdir(workdir, identity, args.overwrite, world, pieces)
            mine = [p for p in pieces if p.index % world.size == world.rank]
            done = finished_pieces(workdir, prefix, pieces, mine)
            todo = [p for p in mine if p.index not in done]
            if done:
                say(f"restart: {len(done)} of {len(mine)} pieces already finished and verified; {len(todo)} to do")
            say(f"{len(inputs)} input(s), {len(pieces)} piece(s), {args.workers} worker(s)"
                + (f" x {world.size} ranks" if world.is_mpi else "") + f", tokenizer {tokenizer.kind} "
                f"vocab {tokenizer.vocab_size} -> {settings.dtype}")
            _import_builder()  # before the pool forks (each worker would spend seconds importing it) and the bar starts
            status, todo_bytes = "ok", 0
            try:
                todo_bytes = sum(piece_bytes(p) for p in todo)
                _run_pieces(todo, args, settings, workdir, world, todo_bytes)
            except (sources.InputError, WorkerDied) as err:
                status = f"rank {world.rank}: {err}"
            except KeyboardInterrupt:
                status = f"rank {world.rank}: interrupted"
            statuses = _mpi_allgather(world, (status, todo_bytes))
            failed = [s for s, _ in statuses if s != "ok"]
            if failed:
                for s in failed:
                    say(f"error: {s}", file=sys.stderr)
                say("finished pieces are kept: rerun the same command to continue", file=sys.stderr)
                return 2
            code = 0
            if world.rank == 0:
                try:
                    lock.check_held()  # nothing is renamed by a run that lost its lock
                    if message := bad_input.check(workdir, pieces, dir_skips, args.max_bad_share):  # most input lost?
                        print(message, file=sys.stderr)
                        code = 2
                    else:
                        manifest = finalize(prefix, workdir, pieces, identity["inputs"], settings, tokenizer,
                                            args.tokenizer, dir_skips)
                        _summary(prefix, manifest, time.time() - t0, sum(n for _, n in statuses))
                except prep_lock.RunLockedError as err:  # said here: the other ranks wait for rank 0's word below
                    print(f"error: rank 0: {err}" if world.is_mpi else f"error: {err}", file=sys.stderr)
                    code = 2
                except Exception:  # noqa: BLE001  ranks waiting below for the manifest must hear of it, not hang
                    if not (world.is_mpi and args.annotate):
                        raise
                    import traceback
                    traceback.print_exc()
                    code = 2
            if not args.annotate:
                return code
            # Annotation is spread over every rank (jieba: ~0.4 MB/s per core), so the others wait for rank 0's
            # manifest; the gather is also how they learn that it failed.
            if world.is_mpi:
                code = int(_mpi_allgather(world, (str(code), 0))[0][0])
            return code or _annotate(prefix, args.annotate, args.workers, only_missing=False, world=world)
    except prep_lock.RunLockedError as err:  # another live run builds this prefix, or this run lost the lock
        print(f"error: rank {world.rank}: {err}" if world.is_mpi else f"error: {err}", file=sys.stderr)
        return 2


def _annotate(prefix: str, spec: str, workers: int, only_missing: bool, world: World) -> int:
    """ERNIE side-cars after the manifest: they are derived from finished shards (annotate.py writes each atomically,
    its .spans.json last). ``only_missing`` (the shards were up to date): keep the side-cars an earlier run of this
    command completed from the shards' current content (data_prep/annotate.py ``complete_sidecars``), so rerunning an
    interrupted command finishes its annotation. Every rank annotates the shards i % size == rank with its own
    ``workers``; rank 0 records the side-cars in the manifest and reports. Returns the exit code."""
    from data_prep import annotate

    report: dict = {}
    try:
        headers = annotate.annotate_corpus(prefix, spec, progress=True, workers=workers, keep_complete=only_missing,
                                           rank=world.rank, size=world.size,
                                           allgather=lambda obj: _mpi_allgather(world, obj), report=report)
    except (OSError, ValueError) as err:
        if world.rank == 0:
            print(f"error: {err}", file=sys.stderr)
        return 2
    if world.rank == 0:
        annotate.print_report(spec, headers, report)
    return 0


def _summary(prefix: str, manifest: dict, seconds: float, processed_bytes: int) -> None:
    t = manifest["totals"]
    print(f"wrote {t['shards']} shard(s): {t['documents']:,} documents, {t['sentences']:,} sequences, "
          f"{t['tokens']:,} tokens ({manifest['dtype']}, {t['bin_bytes'] / 2**20:,.1f} MiB) from "
          f"{t['input_bytes'] / 2**20:,.1f} MiB of input in {seconds:,.1f} s "
          f"({processed_bytes / 2**20 / max(seconds, 1e-9):,.2f} MB/s, {t['documents'] / max(seconds, 1e-9):,.0f} "
          f"docs/s this run)")
    if manifest["skipped"]:
        print("skipped input, by reason: " + ", ".join(f"{k} {v:,}" for k, v in manifest["skipped"].items()))
    else:
        print("skipped input: none")
    print(f"manifest: {mf.manifest_path(prefix)}")


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
