"""The side-car spans of a corpus for ERNIE's phrase/entity masking, verified once per corpus cache entry.

A side-car's ``lengths_sha256`` (data_prep/sidecar.py) guards against spans left beside a shard rebuilt with other
tokens; checking it reads and hashes every sequence length of the shard (~11 ms per 1M sentences). Done in every
``SidecarReader``, that cost was paid per shard in every rank and again in every loader worker: ~23 CPU-s and 8 GB of
``.idx`` reads per process at 2B sentences. Here it is paid once, by the process that builds the corpus's side-car
cache entry (rank 0, or ``python -m trainer.data.build_index`` ahead of the job): the entry's key holds the corpus's
cache key (its shards' checksums and counts) and every side-car's header (its ``lengths_sha256``, counts and
annotator), so another side-car or a rebuilt shard makes another key, and it is checked again. Every other open maps
the spans and their row pointers by offset and reads nothing per sentence.

The headers come from the corpus manifest, where ``data_prep/annotate.py`` records each shard's side-car
(``ShardInfo.sidecar``): a rank reads no ``.spans.json`` at start-up (before, every rank read all of them to make the
key: 1,000 small reads per rank on a shared filesystem for 1,000 shards). A side-car is compared with its record when
a process first opens it (its header is read then anyway), and the check entry's build compares them all, so a
side-car rewritten after the manifest is refused, naming the file. Corpora annotated before the manifest recorded
side-cars still work: their headers are read at start-up, as before.

Every open also compares the side-car's ``bin_sha256`` (the shard content it was made from) with the manifest's
``bin_sha256`` of its shard: token counts alone let a side-car made from the old text of a rebuilt shard through
(traditional -> simplified conversion keeps them). A side-car without it (written before 2026-12-06) is refused with
the command that spot-checks and keys it in seconds per shard (``python -m data_prep.annotate PREFIX --annotate SPEC
--keep-complete``), since nothing here can tell an old valid side-car from a stale one.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_prep.manifest import manifest_path
from data_prep.sidecar import SidecarReader, content_mismatch, header_record
from trainer.data.cache_file import CacheWriter, ensure, settings_hash
from trainer.data.open_maps import OpenShards

SIDECAR_CACHE_VERSION = 3  # 2: keyed by header_record (the manifest's record of each side-car); 3: entries are
# built only past check_content (the shard's bin_sha256): an entry of version 2 was a hit for a side-car the
# new check refuses, which then failed in a loader worker at the first batch instead of at start


def recorded(corpus) -> bool:
    """Whether the manifest records every shard's side-car (``data_prep/annotate.py`` does since 2026-12-05)."""
    shards = corpus.manifest["shards"]
    return bool(shards) and all(spec.get("sidecar") for spec in shards)


def sidecar_headers(corpus) -> list[dict]:
    """What identifies every shard's side-car: from the manifest where it records them (nothing else read), else
    from each ``.spans.json`` (one small read per shard, in every process that opens the corpus)."""
    if recorded(corpus):
        return [dict(spec["sidecar"]) for spec in corpus.manifest["shards"]]
    root = manifest_path(corpus.prefix).parent
    out = []
    for spec in corpus.manifest["shards"]:
        js = root / (spec["prefix"] + ".spans.json")
        if not js.exists():
            raise FileNotFoundError(f"{js} not found: build the shards with `build_indexed.py --annotate SPEC` "
                                    "(ERNIE phrase/entity masking needs them)")
        with open(js, encoding="utf-8") as f:
            out.append(header_record(json.load(f)))
    return out


def check_record(reader: SidecarReader, record: dict, manifest_file) -> None:
    """Refuse a side-car whose header is not what the manifest recorded for it (rewritten behind the manifest)."""
    got, want = header_record(reader.header), header_record(record)
    if got != want:
        raise ValueError(f"{reader.prefix}.spans.json ({got}) is not the side-car {manifest_file} recorded for this "
                         f"shard ({want}): it was rewritten after the manifest. Annotate the corpus again with "
                         "`python -m data_prep.annotate PREFIX --annotate SPEC` (which records the new side-cars) "
                         "before training")


def check_content(reader: SidecarReader, shard: dict, corpus_prefix) -> None:
    """Refuse a side-car not made from its shard's content (``bin_sha256``, data_prep/sidecar.py), naming the fix."""
    why = content_mismatch(reader.header, shard["bin_sha256"], str(corpus_prefix))
    if why is not None:
        raise ValueError(f"{reader.prefix}.spans.json cannot be used for ERNIE masking: {why}")


def has_sidecars(corpus) -> bool:
    shards = corpus.manifest["shards"]
    return recorded(corpus) or (
        bool(shards) and (manifest_path(corpus.prefix).parent / (shards[0]["prefix"] + ".spans.json")).exists())


def verified_sidecars(corpus) -> dict:
    """The corpus's side-car cache entry (built, which verifies every side-car against its shard, if missing):
    ``{"sequences": int64 [shards]}``. Raises what ``SidecarReader`` raises for a side-car that does not match."""
    headers = sidecar_headers(corpus)
    key = settings_hash({"version": SIDECAR_CACHE_VERSION, "corpus": corpus.cache_key(), "sidecars": headers})
    path = Path(corpus.cache.dir) / f"sidecars-{Path(corpus.prefix).name}-{key}.bfc"
    root = manifest_path(corpus.prefix).parent

    def build(out: Path) -> None:
        with CacheWriter(out, "sidecars", key, [("sequences", "<i8", ())]) as w:
            for spec, want in zip(corpus.manifest["shards"], headers):
                reader = SidecarReader(root / spec["prefix"], expect_sequences=int(spec["sentences"]), verify=True)
                check_record(reader, want, manifest_path(corpus.prefix))
                check_content(reader, spec, corpus.prefix)
                w.append("sequences", np.array([len(reader)], np.int64))
            w.commit({"prefix": corpus.prefix})

    arrays, _ = ensure(path, "sidecars", key, build, corpus.cache, f"the side-car check of {corpus.prefix}")
    return arrays


class CorpusSpans:
    """The side-car spans of every shard of an ``IndexedCorpus``, by global sentence index. A shard's side-car is
    opened (its two arrays mapped) on the first read that reaches it, in each process: a rank or loader worker
    whose samples come from a few of 1,000 shards opens those few, not 3,000 files at start-up. Shard sizes come
    from the manifest (the verified entry checked them against the side-cars)."""

    def __init__(self, corpus):
        self.manifest_file = manifest_path(corpus.prefix)
        self.root = self.manifest_file.parent
        verified_sidecars(corpus)  # the lengths check, once per cache entry; the readers below skip it
        self._shards = [(spec["prefix"], int(spec["sentences"])) for spec in corpus.manifest["shards"]]
        self._bins = [{"bin_sha256": spec["bin_sha256"]} for spec in corpus.manifest["shards"]]
        self.prefix = str(corpus.prefix)
        # what the manifest recorded for each side-car (None: not recorded, the headers made the key): a side-car
        # rewritten after that is refused on its first open instead of masking with spans nobody checked
        self._records = [spec.get("sidecar") for spec in corpus.manifest["shards"]]
        self._readers: list[SidecarReader | None] = [None] * len(self._shards)
        self._open = OpenShards(2, self._close_reader)  # .spans.npy and the row pointers (trainer/data/open_maps.py)
        self.starts = np.concatenate([[0], np.cumsum([n for _, n in self._shards], dtype=np.int64)]).astype(np.int64)

    def __getstate__(self):
        return {"root": self.root, "manifest_file": self.manifest_file, "_shards": self._shards,
                "_records": self._records, "starts": self.starts,
                "_bins": self._bins, "prefix": self.prefix}  # a worker opens its own

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._readers = [None] * len(self._shards)
        self._open = OpenShards(2, self._close_reader)

    def _close_reader(self, k: int) -> None:
        self._readers[k] = None

    def reader(self, k: int) -> SidecarReader:
        """Shard ``k``'s side-car, opened on first use (``verify=False``: the cache entry checked it); at most
        ``max_open_shards`` stay open, the least recently used closed first."""
        self._open.touch(k)
        if self._readers[k] is None:
            prefix, sentences = self._shards[k]
            reader = SidecarReader(self.root / prefix, expect_sequences=sentences, verify=False)
            if self._records[k] is not None:
                check_record(reader, self._records[k], self.manifest_file)
            check_content(reader, self._bins[k], self.prefix)  # a string compare: the header was read anyway
            self._readers[k] = reader
        return self._readers[k]

    def range(self, start: int, end: int) -> np.ndarray:
        """Spans of sentences [start, end): int64 [k, 4] (global sentence, token start, token end, kind)."""
        out = []
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < end:
            stop = min(end, int(self.starts[k + 1]))
            part = self.reader(k).range(start - int(self.starts[k]), stop - int(self.starts[k])).astype(np.int64)
            part[:, 0] += self.starts[k]
            out.append(part)
            start, k = stop, k + 1
        return np.concatenate(out) if out else np.zeros((0, 4), np.int64)
