"""``data_prep/build_indexed.py``'s command line: its options and the checks of their values (each refusal names the
option), apart from the build itself to keep that module's size down."""
from __future__ import annotations

import argparse
import math
import os

from data_prep import bad_input, prefix_names, prep_lock, sources


def parse_args(argv=None, doc: str = "") -> argparse.Namespace:
    """build_indexed.py's command line, checked (``doc``: the script's docstring, whose first paragraph is the
    description)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True, action="extend",
                    help="files, directories (recursive), globs (quoted), or builtin:pydocs")
    ap.add_argument("--tokenizer", required=True, help="folder written by data_prep/train_tokenizer.py")
    ap.add_argument("--output-prefix", required=True, help="OUT/NAME: writes OUT/NAME_00000.bin/.idx ...")
    ap.add_argument("--workers", type=int, default=1, help="processes on this machine (per MPI rank)")
    ap.add_argument("--json-key", default="text", help="the text field of .jsonl inputs")
    ap.add_argument("--split-sentences", action="store_true", help="one sequence per sentence (data_prep/sentences.py)")
    ap.add_argument("--chunk-size-mb", type=float, default=None, help="input MB per piece of work (default: the "
                    "inputs' total / 64, between 4 and 256 MB, so small inputs still keep every worker busy)")
    ap.add_argument("--shard-size-mb", type=float, default=512, help="largest .bin of a shard")
    ap.add_argument("--shard-sequences", type=int, default=1_000_000, help="most sequences in a shard (bounds "
                    "the memory of megatron's builder and .idx finalize: ~100 bytes per sequence)")
    ap.add_argument("--max-line-mb", type=float, default=sources.MAX_LINE_BYTES / 2**20,
                    help="longer lines are skipped and counted")
    ap.add_argument("--max-document-mb", type=float, default=sources.MAX_DOCUMENT_BYTES / 2**20,
                    help=".txt documents longer than this are cut into several")
    ap.add_argument("--max-bad-share", type=float, default=bad_input.DEFAULT_MAX_BAD_SHARE,
                    help="stop before the manifest when records skipped as bad input (wrong --json-key, invalid "
                    "JSON or UTF-8, unsupported files) pass this share of the records read (data_prep/bad_input.py);"
                    " 1 accepts any loss")
    ap.add_argument("--tokenizer-threads", type=int, default=0, help="Rust threads per worker; 0 = cores/workers")
    ap.add_argument("--overwrite", action="store_true", help="discard an unfinished run with other settings")
    ap.add_argument("--lock-stale-s", type=float, default=prep_lock.STALE_S, help="a run on another host holding "
                    "this prefix's lock is taken to be dead once its heartbeat has not moved this long "
                    "(data_prep/prep_lock.py; on the same machine a dead pid is seen at once)")
    ap.add_argument("--annotate", metavar="SPEC", help="then write ERNIE span side-cars beside every shard "
                    "(data_prep/annotate.py: jieba | gazetteer:FILE | jsonl:FILE)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    if args.shard_sequences < 1:
        ap.error(f"--shard-sequences {args.shard_sequences}: must be at least 1")
    if args.tokenizer_threads < 0:
        ap.error(f"--tokenizer-threads {args.tokenizer_threads}: must be 0 (cores / workers) or more")
    prefix = args.output_prefix
    if not os.path.basename(prefix) or prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        # the files would be DIR/.manifest.json (hidden) and DIR/_00000.bin: a corpus nothing can name
        ap.error(f"--output-prefix {prefix!r} names a folder; give FOLDER/NAME, e.g. "
                 f"{os.path.join(prefix, 'corpus')} (writes corpus_00000.bin/.idx ... and corpus.manifest.json)")
    if message := prefix_names.too_long(prefix):  # the trainer's cache names hold NAME too
        ap.error(message)
    if not (math.isfinite(args.max_bad_share) and 0 <= args.max_bad_share <= 1):
        ap.error(f"--max-bad-share {args.max_bad_share}: must be a share between 0 and 1")
    if not (math.isfinite(args.lock_stale_s) and args.lock_stale_s > 0):
        ap.error(f"--lock-stale-s {args.lock_stale_s}: must be a positive number of seconds")
    for key in ("chunk_size_mb", "shard_size_mb", "max_line_mb", "max_document_mb"):
        value = getattr(args, key)
        if value is not None and not (math.isfinite(value) and value > 0):  # nan passed a plain `<= 0` check
            ap.error(f"--{key.replace('_', '-')} {value}: must be a positive number of MB")
    return args
