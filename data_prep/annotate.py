"""Annotate a prepared corpus from its shards: ``python -m data_prep.annotate PREFIX --annotate SPEC``.

Corpora prepared without ``build_indexed.py --annotate`` get their ERNIE side-cars afterwards, from the shards alone:
each sequence's text is rebuilt from its tokens (``SequenceText``: ``##``, ``Ġ`` and ``▁`` conventions; no space
between CJK characters) with exact token offsets, so no input is re-read. The text is the tokenizer's normalised
form (lower-cased for uncased tokenizers, which suits jieba and lower-cased gazetteers; pass
``gazetteer-lower:FILE`` to lower-case the entries).

The pieces live in their own modules and are re-exported here, so ``data_prep.annotate.X`` keeps working:
data_prep/annotators.py (``make_annotator`` and the jieba / gazetteer / jsonl annotators, ``align_spans``,
``DocumentAnnotator``) and data_prep/sidecar.py (the side-car format: ``SidecarWriter``, ``SidecarReader``,
``place_spans``, kinds ``ENTITY`` / ``PHRASE``).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

# Re-exported: trainer/ernie, bench/ernie.py, build_indexed.py and tests use data_prep.annotate.X for these.
from data_prep.annotators import (  # noqa: F401
    JIEBA_CHAIN_TAGS,
    JIEBA_ENTITY_TAGS,
    Annotator,
    CharSpan,
    DocumentAnnotator,
    GazetteerAnnotator,
    JiebaAnnotator,
    JsonlAnnotator,
    align_spans,
    make_annotator,
)
from data_prep.sidecar import (  # noqa: F401
    ENTITY,
    FORMAT,
    KINDS,
    PHRASE,
    VERSION,
    SidecarReader,
    SidecarWriter,
    _dedupe_kind_overlaps,
    header_record,
    place_spans,
)


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F or 0xF900 <= o <= 0xFAFF


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character byte-level BPE uses for each byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class SequenceText:
    """Token ids of one sequence -> (text, offsets [n, 2]) rebuilt from the vocabulary, for annotating shards.

    WordPiece/zh: ``##x`` continues a word, other tokens start one (a space before it unless both it and the
    previous token are CJK); SentencePiece: ``▁`` starts a word; byte-level BPE: bytes decoded as UTF-8, ``Ġ`` = space.
    Example (zh): [北, 京, ##s, is] -> "北京s is", offsets [[0,1],[1,2],[2,3],[4,6]].
    """

    def __init__(self, tokenizer):
        self.kind = tokenizer.kind
        self.vocab = tokenizer.tokens
        self.special = set(int(i) for i in tokenizer.special_ids)
        self._bytes = _byte_decoder() if self.kind == "bbpe" else None

    def __call__(self, ids: Sequence[int]) -> tuple[str, np.ndarray]:
        if self._bytes is not None:
            return self._bbpe(ids)
        parts, offsets, pos, prev_cjk = [], [], 0, False
        for i in ids:
            tok = self.vocab[int(i)]
            if int(i) in self.special:
                piece, glue = tok, False
            elif self.kind == "unigram":
                glue = not tok.startswith("▁")
                piece = tok.lstrip("▁")
            else:
                glue = tok.startswith("##")
                piece = tok[2:] if glue else tok
            cjk = len(piece) == 1 and _is_cjk(piece)
            if parts and not glue and not (cjk and prev_cjk):
                parts.append(" ")
                pos += 1
            offsets.append((pos, pos + len(piece)))
            parts.append(piece)
            pos += len(piece)
            prev_cjk = cjk
        return "".join(parts), np.asarray(offsets, np.int64).reshape(-1, 2)

    def _bbpe(self, ids: Sequence[int]) -> tuple[str, np.ndarray]:
        raw, ends = bytearray(), []
        for i in ids:
            tok = self.vocab[int(i)]
            raw.extend(tok.encode() if int(i) in self.special else bytes(self._bytes.get(c, 63) for c in tok))
            ends.append(len(raw))
        # char offset of each byte boundary (a boundary inside a multi-byte character rounds down to it)
        text = raw.decode("utf-8", errors="replace")
        char_at = np.zeros(len(raw) + 1, np.int64)
        pos = 0
        for k, ch in enumerate(text):
            n = len(ch.encode("utf-8", errors="replace")) if ch != "\ufffd" else 1
            char_at[pos + 1:pos + n + 1] = k + 1
            pos += n
        starts = [0] + ends[:-1]
        offsets = np.stack([char_at[starts], char_at[ends]], axis=1) if ends else np.zeros((0, 2), np.int64)
        # a leading space (Ġ) belongs to no word: start the token after it
        for t, (a, b) in enumerate(offsets.tolist()):
            if a < b and text[a] == " ":
                offsets[t, 0] = a + 1
        return text, offsets


# A shard whose CJK text is at least this share traditional-only characters (annotators.count_traditional), once
# this many CJK characters were seen, is warned about: jieba is 100-500x slower on it (BENCHMARKS.md).
TRADITIONAL_WARN_SHARE, TRADITIONAL_WARN_AFTER = 0.03, 2000
SPOT_CHECK_SEQUENCES = 64  # sequences of an unkeyed side-car annotated again to compare (complete_sidecars)


def _traditional_warning(shard: str, trad: int, cjk: int, spec: str) -> str:
    head = f"warning: {shard}: {trad:,} of {cjk:,} CJK characters ({trad / cjk:.1%}) are traditional-only forms; "
    fix = "convert the input with OpenCC t2s (`opencc -c t2s`) before build_indexed.py"
    if "hmm=off" in spec:
        return head + f"jieba's dictionary is simplified Chinese and phrases them poorly: {fix}"
    return (head + f"jieba (--annotate {spec}) annotates traditional or classical text 100-500x slower than "
            "simplified (its HMM tries every state on characters it has no entry for) and phrases it poorly: "
            f"{fix}, or annotate with --annotate jieba:hmm=off (fast, but finds no out-of-dictionary words such as "
            "names)")


def annotate_shard(shard_prefix: str, spec: str, tokenizer_dir: str, bin_sha256: str | None = None) -> dict:
    """Write one shard's side-car from its tokens; returns the header. Runs in a worker process (picklable args).

    The shard's ``.bin`` is hashed first and the checksum written into the header (the side-car's key to the shard's
    content); ``bin_sha256`` (the manifest's) must match it, else the shard on disk is not the corpus's."""
    import sys

    from megatron.core.datasets.indexed_dataset import IndexedDataset  # slow import: only this path needs it

    from data_prep.annotators import count_traditional
    from data_prep.manifest import sha256_file
    from data_prep.tokenizer import load_tokenizer

    digest = sha256_file(shard_prefix + ".bin")
    if bin_sha256 is not None and digest != bin_sha256:
        raise ValueError(f"{shard_prefix}.bin has sha256 {digest[:12]}..., its corpus manifest says {bin_sha256[:12]}"
                         "...: the shard was changed after the manifest was written; rebuild the corpus with "
                         "build_indexed.py")
    annotator = make_annotator(spec)
    to_text = SequenceText(load_tokenizer(tokenizer_dir))
    ds = IndexedDataset(shard_prefix)
    writer = SidecarWriter(shard_prefix, spec=spec)
    check = spec.split(":")[0] == "jieba"
    trad = cjk = 0
    warned = False
    for k in range(len(ds)):
        text, offsets = to_text(ds[k])
        if check:
            t, c = count_traditional(text)
            trad, cjk = trad + t, cjk + c
            if not warned and cjk >= TRADITIONAL_WARN_AFTER and trad >= TRADITIONAL_WARN_SHARE * cjk:
                print(_traditional_warning(shard_prefix, trad, cjk, spec), file=sys.stderr, flush=True)  # now, not
                warned = True  # after the hours it explains
        spans, dropped = align_spans(annotator(text), offsets)
        writer.stats["misaligned"] += dropped
        writer.stats["entity"] += int((spans[:, 2] == ENTITY).sum())
        writer.stats["phrase"] += int((spans[:, 2] == PHRASE).sum())
        writer.add_document_spans([spans], [len(ds[k])])
    if check:
        writer.stats["cjk_chars"], writer.stats["traditional_chars"] = cjk, trad
    return writer.finalize(bin_sha256=digest)


def record_sidecars(prefix: str | Path, headers: list[dict]) -> None:
    """Record every shard's side-car header (``header_record``) in the corpus manifest, rewritten atomically: the
    trainer then keys its side-car check by the manifest alone, and no rank reads a ``.spans.json`` at start-up
    (issue 25: 1,000 small reads per rank on a shared filesystem)."""
    from data_prep.manifest import read_manifest, write_manifest

    manifest = read_manifest(prefix)
    if len(headers) != len(manifest["shards"]):
        raise ValueError(f"{len(headers)} side-car headers for the {len(manifest['shards'])} shards of {prefix}")
    for shard, header in zip(manifest["shards"], headers):
        shard["sidecar"] = header_record(header)
    write_manifest(prefix, manifest)


class _SpotCheck:
    """Annotates a sample of an unkeyed side-car's sequences again and compares them with the stored spans: a side-car
    left beside a shard rebuilt from other text (traditional -> simplified: same token counts, other ids) differs on
    almost any sequence with text, so 64 evenly spaced ones tell it apart for ~0.1 s a shard, not hours."""

    def __init__(self, spec: str, tokenizer_dir: str):
        self.annotator = make_annotator(spec)
        from data_prep.tokenizer import load_tokenizer

        self.to_text = SequenceText(load_tokenizer(tokenizer_dir))

    def matches(self, shard_prefix: str, reader: SidecarReader) -> bool:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        ds = IndexedDataset(shard_prefix)
        for k in sorted(set(np.linspace(0, len(ds) - 1, min(len(ds), SPOT_CHECK_SEQUENCES)).astype(int).tolist())):
            text, offsets = self.to_text(ds[k])
            spans, _ = align_spans(self.annotator(text), offsets)
            if not np.array_equal(_dedupe_kind_overlaps(spans.astype(np.int32).reshape(-1, 3)), reader[k]):
                return False
        return True


def _add_key(js: Path, header: dict, bin_sha256: str) -> dict:
    """Rewrite an unkeyed side-car's ``.spans.json`` with ``bin_sha256`` (atomically; the spans stay as they are)."""
    import json
    import os

    header = {**header, "bin_sha256": bin_sha256}
    with open(f"{js}.tmp", "w", encoding="utf-8") as f:
        json.dump(header, f, indent=1, ensure_ascii=False)
    os.replace(f"{js}.tmp", js)
    return header


def complete_sidecars(prefix: str | Path, spec: str, shards: Sequence[int] | None = None,
                      notes: Counter | None = None) -> dict[int, dict]:
    """The headers of the shards (by index in the manifest; ``shards``: only these) whose side-car is complete and was
    made by ``spec`` from the shard's current content: its ``.spans.json`` exists, its sequence count and
    ``lengths_sha256`` match the shard's ``.idx`` and its ``bin_sha256`` is the manifest's for the shard. What an
    interrupted annotation already finished; everything else is annotated again.

    A side-car written before ``bin_sha256`` existed (2026-12-06) is spot-checked (``_SpotCheck``): if its spans
    equal a fresh annotation of 64 of its sequences and the ``.bin`` on disk is the manifest's, the checksum is added
    to its header (it counts as complete), else it is annotated again. ``notes`` counts why side-cars were not
    complete ("stale": made from other content; "other spec"; "missing or partial") and how many were "keyed". The
    spec is compared as text: after editing a gazetteer or user dictionary, rewrite every side-car with
    ``python -m data_prep.annotate``."""
    from data_prep.manifest import manifest_path, read_manifest, sha256_file, tokenizer_dir

    manifest = read_manifest(prefix)
    root = manifest_path(prefix).parent
    notes = Counter() if notes is None else notes
    checker = None
    done = {}
    for i in range(len(manifest["shards"])) if shards is None else shards:
        shard = manifest["shards"][i]
        shard_prefix = str(root / shard["prefix"])
        try:
            reader = SidecarReader(shard_prefix, expect_sequences=shard["sentences"])
        except (OSError, ValueError, KeyError):
            notes["missing or partial"] += 1
            continue  # missing, partial, or made for other tokens: annotated again
        header = reader.header
        if header.get("annotator") != spec or not header.get("lengths_sha256"):
            notes["other spec"] += 1
            continue
        if header.get("bin_sha256") is None:
            checker = checker or _SpotCheck(spec, str(tokenizer_dir(prefix)))
            if sha256_file(shard_prefix + ".bin") != shard["bin_sha256"] or not checker.matches(shard_prefix, reader):
                notes["stale"] += 1
                continue
            header = _add_key(Path(shard_prefix + ".spans.json"), header, shard["bin_sha256"])
            notes["keyed"] += 1
        elif header["bin_sha256"] != shard["bin_sha256"]:
            notes["stale"] += 1
            continue
        done[i] = header
    return done


def _annotate_share(prefix, spec: str, mine: list[int], shards: list[dict], root: Path, tok_dir: str, workers: int,
                    progress: bool, existing: dict[int, dict]) -> dict[int, dict]:
    """Annotate the shards ``mine`` not in ``existing`` with ``workers`` processes; returns their headers."""
    from tqdm import tqdm

    todo = [i for i in mine if i not in existing]
    args = {i: (str(root / shards[i]["prefix"]), spec, tok_dir, shards[i]["bin_sha256"]) for i in todo}
    bar = tqdm(total=len(todo), unit="shard", disable=not progress, desc="annotate")
    made = {}
    if workers <= 1 or len(todo) <= 1:
        for i in todo:
            made[i] = annotate_shard(*args[i])
            bar.update(1)
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(min(workers, len(todo))) as pool:
            jobs = {i: pool.apply_async(annotate_shard, args[i]) for i in todo}
            for i, job in jobs.items():
                made[i] = job.get()
                bar.update(1)
    bar.close()
    return made


def annotate_corpus(prefix: str | Path, spec: str, progress: bool = True, workers: int = 1,
                    existing: dict[int, dict] | None = None, keep_complete: bool = False, rank: int = 0,
                    size: int = 1, allgather=None, report: dict | None = None) -> list[dict]:
    """Write the side-car of every shard of a prepared corpus (``PREFIX.manifest.json``), then record their headers
    in the manifest (``record_sidecars``); returns the headers.

    ``existing`` (from ``complete_sidecars``), or ``keep_complete`` (each rank calls it for its own shards): shards
    whose side-car is kept as it is; the manifest is rewritten only when what it records changes. Shards are
    independent: ``workers`` processes take one shard at a time (each loads jieba's dictionary once, ~1 s).

    Several ranks (MPI: ``rank`` of ``size``, ``allgather`` = every rank's value of one object, also the barrier):
    rank r takes the shards i with i % size == r (a function of the manifest alone, so a rerun gives each rank the
    same shards and finds the side-cars it finished), then every rank gets all headers and rank 0 alone writes the
    manifest. An error on one rank is raised on every rank after the gather, so none waits for a dead one. ``report``
    receives "kept" (shards kept), "notes" (``complete_sidecars``'s) and "traditional" (shards warned about). The
    spec is checked first, so a bad spec fails before any worker starts."""
    from data_prep.manifest import manifest_path, read_manifest, tokenizer_dir

    notes: Counter = Counter()
    status, made, kept, shards = "ok", {}, {}, []
    try:
        # in the try: a rank that cannot read these (a node-local jieba:userdict=PATH, a manifest on a filesystem one
        # node lacks) says so through the gather instead of exiting while the others wait there (found by review)
        manifest = read_manifest(prefix)
        make_annotator(spec)
        root = manifest_path(prefix).parent
        tok_dir = str(tokenizer_dir(prefix))
        shards = manifest["shards"]
        mine = [i for i in range(len(shards)) if i % size == rank]
        kept = complete_sidecars(prefix, spec, mine, notes) if keep_complete else {
            i: h for i, h in (existing or {}).items() if i in mine}
        made = _annotate_share(prefix, spec, mine, shards, root, tok_dir, workers, progress and rank == 0, kept)
    except Exception as err:  # noqa: BLE001  any error: the other ranks must not wait in the gather for this one
        if size == 1:
            raise
        status = f"rank {rank}: {type(err).__name__}: {err}"
    if size > 1:
        gathered = allgather((status, kept, made, notes))
        failed = [s for s, *_ in gathered if s != "ok"]
        if failed:
            raise ValueError("annotation failed on " + "; ".join(failed) + " (finished side-cars are kept: rerun)")
        kept, made, notes = {}, {}, Counter()
        if report is not None:
            report["per_rank"] = [len(m) for _, _, m, _ in gathered]  # shards each rank annotated itself
        for _, k, m, n in gathered:
            kept.update(k)
            made.update(m)
            notes.update(n)
    headers = [kept[i] if i in kept else made[i] for i in range(len(shards))]
    if report is not None:
        report.update(kept=len(kept), notes=notes, traditional=sum(
            1 for h in made.values() if h["stats"].get("traditional_chars", 0) >= TRADITIONAL_WARN_SHARE
            * max(TRADITIONAL_WARN_AFTER, h["stats"].get("cjk_chars", 0))))
    if rank == 0 and (made or any(s.get("sidecar") != header_record(h) for s, h in zip(shards, headers))):
        record_sidecars(prefix, headers)
    return headers


def print_report(spec: str, headers: list[dict], report: dict) -> None:
    """What a run did, on stdout: kept / annotated counts, why side-cars were annotated again, traditional shards."""
    notes = report["notes"]
    total, kept = len(headers), report["kept"]
    if kept:
        keyed = f" ({notes['keyed']} older one(s) spot-checked and keyed to their shard)" if notes["keyed"] else ""
        print(f"{kept} of {total} shard(s) already have a complete side-car from {spec}{keyed}")
    if notes["stale"]:
        print(f"note: {notes['stale']} side-car(s) made by {spec} from other shard content (the shards were rebuilt "
              "after annotating) were annotated again")
    if report["traditional"]:
        print(f"warning: {report['traditional']} shard(s) are largely traditional Chinese (see the warnings above): "
              "convert the input with OpenCC t2s for speed and phrase quality")
    per_rank = report.get("per_rank")
    print(f"annotated {total - kept} shard(s) with {spec}: {sum(h['spans'] for h in headers):,} spans in all {total}"
          + (f"; annotated by {len(per_rank)} ranks: {per_rank}" if per_rank else ""))


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m data_prep.annotate",
                                description="Write ERNIE phrase/entity side-cars for a prepared corpus's shards.")
    p.add_argument("prefix", help="PREFIX of PREFIX.manifest.json (written by build_indexed.py)")
    p.add_argument("--annotate", required=True, metavar="SPEC",
                   help="jieba[:hmm=off,userdict=PATH] | gazetteer:FILE | gazetteer-lower:FILE | jsonl:FILE")
    p.add_argument("--workers", type=int, default=1, help="processes per rank, one shard at a time each (default 1)")
    p.add_argument("--keep-complete", action="store_true",
                   help="keep every side-car made by SPEC from its shard's current content (older ones without a "
                        "shard checksum are spot-checked and keyed); default: annotate every shard again")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    from data_prep.mpi_world import detect_world, mpi_allgather  # MPI: as build_indexed.py (mpirun / srun)

    world = detect_world()
    report: dict = {}
    try:
        headers = annotate_corpus(args.prefix, args.annotate, progress=not args.quiet, workers=args.workers,
                                  keep_complete=args.keep_complete, rank=world.rank, size=world.size,
                                  allgather=lambda obj: mpi_allgather(world, obj), report=report)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    if world.rank != 0:
        return 0
    seqs = sum(h["sequences"] for h in headers)
    stats = Counter()
    for h in headers:
        stats.update(h["stats"])
    print_report(args.annotate, headers, report)
    print(f"annotated {seqs:,} sequences in {len(headers)} shard(s)"
          + (f" on {world.size} ranks" if world.size > 1 else "") + f": {stats['entity']:,} entities, "
          f"{stats['phrase']:,} phrases ({stats['misaligned']:,} matches off token boundaries dropped)")
    return 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    raise SystemExit(main())
