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


def annotate_shard(shard_prefix: str, spec: str, tokenizer_dir: str) -> dict:
    """Write one shard's side-car from its tokens; returns the header. Runs in a worker process (picklable args)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # slow import: only this path needs it

    from data_prep.tokenizer import load_tokenizer

    annotator = make_annotator(spec)
    to_text = SequenceText(load_tokenizer(tokenizer_dir))
    ds = IndexedDataset(shard_prefix)
    writer = SidecarWriter(shard_prefix, spec=spec)
    for k in range(len(ds)):
        text, offsets = to_text(ds[k])
        spans, dropped = align_spans(annotator(text), offsets)
        writer.stats["misaligned"] += dropped
        writer.stats["entity"] += int((spans[:, 2] == ENTITY).sum())
        writer.stats["phrase"] += int((spans[:, 2] == PHRASE).sum())
        writer.add_document_spans([spans], [len(ds[k])])
    return writer.finalize()


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


def complete_sidecars(prefix: str | Path, spec: str) -> dict[int, dict]:
    """The headers of the shards (by index in the manifest) whose side-car is complete and was made by ``spec`` for
    the shard's current tokens (its ``.spans.json`` exists, its sequence count and ``lengths_sha256`` match the
    shard's ``.idx``): what an interrupted annotation already finished. Costs one read of every ``.idx``'s lengths.
    A side-car of an older format (no ``lengths_sha256``) or another spec is not complete. The spec is compared as
    text: after editing a gazetteer file, rewrite every side-car with ``python -m data_prep.annotate``."""
    from data_prep.manifest import manifest_path, read_manifest

    manifest = read_manifest(prefix)
    root = manifest_path(prefix).parent
    done = {}
    for i, shard in enumerate(manifest["shards"]):
        try:
            header = SidecarReader(root / shard["prefix"], expect_sequences=shard["sentences"]).header
        except (OSError, ValueError, KeyError):
            continue  # missing, partial, or made for other tokens: annotated again
        if header.get("annotator") == spec and header.get("lengths_sha256"):
            done[i] = header
    return done


def annotate_corpus(prefix: str | Path, spec: str, progress: bool = True, workers: int = 1,
                    existing: dict[int, dict] | None = None) -> list[dict]:
    """Write the side-car of every shard of a prepared corpus (``PREFIX.manifest.json``), then record their headers
    in the manifest (``record_sidecars``); returns the headers.

    ``existing`` (from ``complete_sidecars``): shards whose side-car is kept as it is; the manifest is rewritten only
    when what it records changes. Shards are independent: ``workers`` processes take one shard at a time (each loads
    jieba's dictionary once, ~1 s). The annotator spec is checked here first, so a bad spec fails before any worker
    starts."""
    from tqdm import tqdm

    from data_prep.manifest import manifest_path, read_manifest, tokenizer_dir

    manifest = read_manifest(prefix)
    make_annotator(spec)
    root = manifest_path(prefix).parent
    tok_dir = str(tokenizer_dir(prefix))
    existing = existing or {}
    shards = [str(root / shard["prefix"]) for shard in manifest["shards"]]
    todo = [i for i in range(len(shards)) if i not in existing]
    bar = tqdm(total=len(todo), unit="shard", disable=not progress, desc="annotate")
    made = {}
    if workers <= 1 or len(todo) <= 1:
        for i in todo:
            made[i] = annotate_shard(shards[i], spec, tok_dir)
            bar.update(1)
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(min(workers, len(todo))) as pool:
            jobs = {i: pool.apply_async(annotate_shard, (shards[i], spec, tok_dir)) for i in todo}
            for i, job in jobs.items():
                made[i] = job.get()
                bar.update(1)
    bar.close()
    headers = [existing[i] if i in existing else made[i] for i in range(len(shards))]
    if made or any(shard.get("sidecar") != header_record(h) for shard, h in zip(manifest["shards"], headers)):
        record_sidecars(prefix, headers)
    return headers


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m data_prep.annotate",
                                description="Write ERNIE phrase/entity side-cars for a prepared corpus's shards.")
    p.add_argument("prefix", help="PREFIX of PREFIX.manifest.json (written by build_indexed.py)")
    p.add_argument("--annotate", required=True, metavar="SPEC",
                   help="jieba | gazetteer:FILE | gazetteer-lower:FILE | jsonl:FILE")
    p.add_argument("--workers", type=int, default=1, help="processes, one shard at a time each (default 1)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        headers = annotate_corpus(args.prefix, args.annotate, progress=not args.quiet, workers=args.workers)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    seqs = sum(h["sequences"] for h in headers)
    stats = Counter()
    for h in headers:
        stats.update(h["stats"])
    print(f"annotated {seqs:,} sequences in {len(headers)} shard(s): {stats['entity']:,} entities, "
          f"{stats['phrase']:,} phrases ({stats['misaligned']:,} matches off token boundaries dropped)")
    return 0


if __name__ == "__main__":
    from data_prep.utf8_mode import reexec_in_utf8_mode
    reexec_in_utf8_mode()  # a non-UTF-8 locale (GB18030, latin-1): data_prep/utf8_mode.py
    raise SystemExit(main())
