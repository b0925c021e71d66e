"""Inspect a prepared corpus: the manifest's totals, checksum and count verification, a few documents decoded.

    python data_prep/inspect_indexed.py OUT/corpus [--show 3] [--no-verify] [--tokenizer DIR]

Verification reads every shard once: both files' sha256 against the manifest, then megatron-core's
``IndexedDataset`` (the reader the trainer uses) for the number of documents, sequences and tokens. Any mismatch is
printed with the shard's name and the process exits with status 1, so the command can gate a pipeline.
"""
from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python data_prep/inspect_indexed.py`: make `data_prep` importable
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import sys
import warnings
from pathlib import Path

from data_prep import manifest as mf


def open_shard(path_prefix: str):
    """megatron-core's reader for one shard (imported here: megatron takes seconds to import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    return IndexedDataset(path_prefix, multimodal=False, mmap=True)


def verify(prefix: str, manifest: dict) -> list[str]:
    """Problems found, one line each naming the shard (empty when everything matches)."""
    root = mf.manifest_path(prefix).parent
    problems = []
    for shard in manifest["shards"]:
        base = root / shard["prefix"]
        name = shard["prefix"]
        bin_path, idx_path = Path(f"{base}.bin"), Path(f"{base}.idx")
        missing = [p.name for p in (bin_path, idx_path) if not p.exists()]
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        if bin_path.stat().st_size != shard["bin_bytes"]:
            problems.append(f"{name}: .bin is {bin_path.stat().st_size} bytes, the manifest says {shard['bin_bytes']}")
            continue
        for path, key in ((bin_path, "bin_sha256"), (idx_path, "idx_sha256")):
            if mf.sha256_file(path) != shard[key]:
                problems.append(f"{name}: {path.name} checksum differs from the manifest (corrupted or rewritten)")
        if any(p.startswith(name + ":") for p in problems):
            continue
        try:
            ds = open_shard(str(base))
            documents = len(ds.document_indices) - 1
            sequences = len(ds)
            tokens = int(ds.sequence_lengths.sum())
        except Exception as err:  # megatron raises assorted errors (AssertionError, ValueError) on a bad index
            problems.append(f"{name}: megatron-core cannot open it ({type(err).__name__}: {err})")
            continue
        for what, got in (("documents", documents), ("sentences", sequences), ("tokens", tokens)):
            if got != shard[what]:
                problems.append(f"{name}: {got} {what} in the shard, the manifest says {shard[what]}")
    return problems


def show_documents(prefix: str, manifest: dict, count: int, tokenizer_dir: str | None) -> None:
    from data_prep.tokenizer import load_tokenizer

    tok_dir = tokenizer_dir or manifest["tokenizer"]["path"]
    try:
        tokenizer = load_tokenizer(tok_dir)
    except (ValueError, OSError) as err:
        print(f"cannot decode: tokenizer {tok_dir} does not load ({err}); pass --tokenizer DIR")
        return
    if tokenizer.fingerprint != manifest["tokenizer"]["fingerprint"]:
        print(f"warning: {tok_dir} is not the tokenizer the shards were made with (fingerprint differs); "
              f"the text below is wrong")
    root = mf.manifest_path(prefix).parent
    shown = 0
    for shard in manifest["shards"]:
        ds = open_shard(str(root / shard["prefix"]))
        for d in range(len(ds.document_indices) - 1):
            if shown == count:
                return
            first, last = int(ds.document_indices[d]), int(ds.document_indices[d + 1])
            print(f"--- document {shown} ({shard['prefix']} #{d}, {last - first} sequences)")
            for s in range(first, min(last, first + 8)):
                print("  " + tokenizer.decode(ds[s].tolist()))
            if last - first > 8:
                print(f"  ... {last - first - 8} more")
            shown += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="the --output-prefix given to build_indexed.py (or its .manifest.json)")
    ap.add_argument("--show", type=int, default=3, help="documents to decode (0: none)")
    ap.add_argument("--no-verify", action="store_true", help="skip reading every shard")
    ap.add_argument("--tokenizer", help="decode with this folder instead of the manifest's")
    args = ap.parse_args(argv)
    prefix = args.prefix[: -len(mf.SUFFIX)] if args.prefix.endswith(mf.SUFFIX) else args.prefix
    try:
        manifest = mf.read_manifest(prefix)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    t, tok = manifest["totals"], manifest["tokenizer"]
    print(f"{mf.manifest_path(prefix)}: {t['shards']} shard(s), {t['documents']:,} documents, {t['sentences']:,} "
          f"sequences, {t['tokens']:,} tokens ({manifest['dtype']}, {t['bin_bytes'] / 2**20:,.1f} MiB) from "
          f"{len(manifest['inputs'])} input(s), {t['input_bytes'] / 2**20:,.1f} MiB")
    print(f"tokenizer: {tok['kind']}, vocab {tok['vocab_size']}, {tok['path']} ({tok['fingerprint'][:16]})")
    print(f"settings: {manifest['settings']}")
    skipped = manifest["skipped"]
    print("skipped input: " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) if skipped else "none"))
    status = 0
    if not args.no_verify:
        problems = verify(prefix, manifest)
        for line in problems:
            print(f"FAILED {line}")
        if problems:
            status = 1
        else:
            print(f"verified: {t['shards']} shard(s), checksums and counts match the manifest")
    if args.show and status == 0:
        show_documents(prefix, manifest, args.show, args.tokenizer)
    return status


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    sys.exit(main())
