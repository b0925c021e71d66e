"""The work folder of ``build_indexed``: what defines a run, restart detection and the atomic finalize.

A run is planned as deterministic pieces of the input (``plan_pieces``); each finished piece leaves a record in
``PREFIX.work/`` next to its shards. A restart with the same identity (inputs, settings, tokenizer) verifies and skips
finished pieces; ``finalize`` renames every shard to its final name and writes the manifest last, so no half-written
file ever carries a final name and a missing manifest means an unfinished run. A finished corpus of the same prefix
stays usable (manifest and shards untouched) while a run of another command works in the work folder: ``finalize``
removes the old manifest only just before it renames the first new shard.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from data_prep import __version__
from data_prep import manifest as mf
from data_prep import sources

@dataclass(frozen=True)
class Settings:
    """Everything that defines the output bytes (recorded in the manifest; a restart must match it)."""

    json_key: str
    split_sentences: bool
    chunk_bytes: int
    shard_bytes: int
    shard_sequences: int
    max_line_bytes: int
    max_document_bytes: int
    dtype: str


@dataclass(frozen=True)
class Piece:
    index: int
    path: str
    start: int
    end: int | None
    more: tuple[str, ...] = ()
    """A group of small inputs (``plan_pieces``): the inputs read whole after ``path`` (which is then read whole)."""

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.more)

    def as_record(self) -> dict:
        """The piece as its work record stores it; "more" only for a group, so a record written before grouping
        existed (same plan: no group) still matches and a restart reuses it."""
        rec = {"index": self.index, "path": self.path, "start": self.start, "end": self.end}
        return {**rec, "more": list(self.more)} if self.more else rec

    def describe(self) -> str:
        if self.more:
            return f"{self.path} and {len(self.more)} more input(s)"
        return f"{self.path} from {'module' if self.path == sources.PYDOCS else 'byte'} {self.start}"


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_size: int

    @property
    def is_mpi(self) -> bool:
        return self.size > 1


def record_name(index: int) -> str:
    return f"piece_{index:06d}.json"


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


AUTO_PIECES = 64
AUTO_MIN_BYTES, AUTO_MAX_BYTES = 4 << 20, 256 << 20


def auto_chunk_bytes(total_bytes: int) -> int:
    """The default piece size: the inputs cut into ~64 pieces, each between 4 MB and 256 MB.

    A function of the input size only, not of --workers or the MPI world size: the piece layout is part of the
    output (shards are per piece) and of what a restart must match, so the same command on another machine or with
    another worker count must cut the same pieces. 64 pieces keep up to 16 processes busy with >= 4 pieces each
    (a finished worker takes the next piece, so the last pieces balance the load); below 256 MB of input the 4 MB
    floor bounds the per-piece cost (a pool task, one shard's finalize and fsync, a record). Examples: 97 MB -> 4 MB
    (25 pieces), 2 GB -> 32 MB, 20 GB and more -> 256 MB (the previous fixed default).
    """
    return int(min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, -(-total_bytes // AUTO_PIECES))))


def plan_pieces(inputs: list[str], settings: Settings, group: bool = True) -> list[Piece]:
    """The pieces of the run, in input order. An input of at least ``chunk_bytes`` (or builtin:pydocs) is cut by
    ``sources.piece_bounds``; consecutive smaller ones are grouped into one piece of up to ``chunk_bytes`` (their
    sizes on disk), read whole one after the other, so that 10,000 news articles make a few pieces and shards, not
    10,000 (each piece is a pool task, a record and at least one .bin/.idx pair the trainer opens and maps). A
    function of the input list, their sizes and the settings only. A group of one is an ordinary piece, so corpora
    of large files plan exactly as before grouping existed. ``group=False``: one piece per small input (tests)."""
    pieces: list[Piece] = []
    group: list[str] | None = [] if group else None
    acc = 0

    def close() -> None:
        nonlocal acc
        if group:
            pieces.append(Piece(len(pieces), group[0], 0, None, tuple(group[1:])))
            group.clear()
        acc = 0

    for path in inputs:
        size = sources.input_bytes(path) if path != sources.PYDOCS else None
        if group is not None and size is not None and size < settings.chunk_bytes:
            if acc + size > settings.chunk_bytes:
                close()
            group.append(path)
            acc += size
            continue
        close()
        for start, end in sources.piece_bounds(path, settings.chunk_bytes, settings.max_line_bytes):
            pieces.append(Piece(len(pieces), path, start, end))
    close()
    return pieces


def piece_bytes(piece: Piece) -> int:
    """Input bytes of a piece (progress, and what a run has to do)."""
    if piece.more:
        return sum(sources.input_bytes(p) for p in piece.paths)
    return sources.piece_size(piece.path, piece.start, piece.end)


def piece_documents(piece: Piece, skipped: Counter, per_input: list[Counter] | None = None, **read):
    """The documents of a piece in order: its byte range, or each input of a group read whole, in turn (as
    separate pieces would read them: a document never spans two inputs, bad input is checked and reported per
    file with its line numbers). ``per_input`` (a group): receives each input's skip counts too, so a record can
    say which file lost what. ``read``: sources.iter_documents' keyword arguments."""
    if not piece.more:
        yield from sources.iter_documents(piece.path, skipped=skipped, start=piece.start, end=piece.end, **read)
        return
    for path in piece.paths:
        mine: Counter = Counter()
        yield from sources.iter_documents(path, skipped=mine, **read)
        skipped.update(mine)
        if per_input is not None:
            per_input.append(mine)


def plan_identity(inputs, settings, tokenizer, pieces) -> dict:
    """What a work folder or a manifest must match to be reused."""
    def stat(path):
        if path == sources.PYDOCS:
            return {"path": path, "bytes": sources.input_bytes(path)}
        try:
            st = os.stat(path)
        except OSError as err:
            raise sources.InputError(f"{path}: cannot read ({err.strerror}); fix permissions or remove it from "
                                     f"--input") from err
        return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}

    return {"settings": asdict(settings), "tokenizer_fingerprint": tokenizer.fingerprint,
            # a group is [first input, 0, None, inputs in the group]: the inputs' order pins down which they are
            "inputs": [stat(p) for p in inputs], "pieces": [[p.path, p.start, p.end, *([len(p.paths)] if p.more
                                                                                       else [])] for p in pieces],
            "tool_version": __version__}


def prepare_workdir(workdir: Path, identity: dict, overwrite: bool, world: World, pieces: list[Piece]) -> None:
    plan_file = workdir / "plan.json"
    if plan_file.exists() and not overwrite:
        old = json.loads(plan_file.read_text(encoding="utf-8"))
        if old != json.loads(json.dumps(identity)):
            diff = sorted(k for k in identity if old.get(k) != json.loads(json.dumps(identity[k])))
            if diff == ["pieces"] and set(old) == set(identity):
                # Same inputs, settings, tokenizer and tool version, other pieces: planned by a build_indexed from
                # before small inputs were grouped (one piece per input). Its records describe other pieces, so
                # none can be reused; restarting is what finishing it would take anyway. Said, never silent.
                if world.rank == 0:
                    print(f"note: {workdir} holds an unfinished run of this same command, planned by an older "
                          f"build_indexed into {len(old.get('pieces') or [])} pieces (this version groups small "
                          f"inputs: {len(pieces)} pieces); its finished pieces cannot be reused: restarting the run "
                          f"from the start", file=sys.stderr, flush=True)
                overwrite = True
            else:
                raise SystemExit(f"error: {workdir} holds an unfinished run with other {', '.join(diff)}; rerun "
                                 f"that command to finish it, or add --overwrite to discard it")
    workdir.mkdir(parents=True, exist_ok=True)
    if overwrite:  # each rank clears its own pieces' records; rank 0 also those beyond the new plan
        for p in pieces:
            if p.index % world.size == world.rank:
                (workdir / record_name(p.index)).unlink(missing_ok=True)
        if world.rank == 0:
            for rec in workdir.glob("piece_*.json"):
                if int(rec.stem.split("_")[1]) >= len(pieces):
                    rec.unlink()
    if world.rank == 0:
        write_json_atomic(plan_file, identity)


def _final_locations(prefix: str, records: list[dict]) -> dict[str, str]:
    """work name -> final shard prefix, numbering shards in piece order."""
    names = [s["work_name"] for r in records for s in r["shards"]]
    return {name: mf.shard_name(prefix, i) for i, name in enumerate(names)}


def _shard_intact(workdir: Path, shard: dict, final: str | None) -> bool:
    """Both files present (in the work folder, or already renamed to ``final``) with the recorded checksums."""
    for ext, key in ((".bin", "bin_sha256"), (".idx", "idx_sha256")):
        path = workdir / (shard["work_name"] + ext)
        if not path.exists() and final is not None:
            path = Path(final + ext)
        if not path.exists() or mf.sha256_file(path) != shard[key]:
            return False
    return True


def finished_pieces(workdir: Path, prefix: str, pieces: list[Piece], mine: list[Piece]) -> set[int]:
    """Indices of my pieces whose record exists and whose shards are intact (checksums verified)."""
    records = {}
    for p in pieces:
        rec = workdir / record_name(p.index)
        if rec.exists():
            records[p.index] = json.loads(rec.read_text(encoding="utf-8"))
    # Shards leave the work folder only during finalize, which runs after every piece is done: numbering them is
    # only needed (and only possible) when every record exists.
    finals = _final_locations(prefix, [records[p.index] for p in pieces]) if len(records) == len(pieces) else {}
    done = set()
    for p in mine:
        rec = records.get(p.index)
        if rec is not None and rec["piece"] == p.as_record() and all(
            _shard_intact(workdir, s, finals.get(s["work_name"])) for s in rec["shards"]
        ):
            done.add(p.index)
    return done


# ---------------------------------------------------------------------------------------------------- finalize


def finalize(prefix: str, workdir: Path, pieces: list[Piece], inputs: list[dict], settings: Settings,
              tokenizer, tokenizer_arg: str, extra_skipped: Counter) -> dict:
    """``inputs``: the plan's input records (``plan_identity``: path, bytes, mtime_ns), stored as the manifest's
    ``inputs``: what the inputs were when the run planned its pieces, so an input changed during the run does not
    match at the next run (which rebuilds), where a stat taken now would."""
    records = []
    for p in pieces:
        rec = workdir / record_name(p.index)
        if not rec.exists():
            raise SystemExit(f"error: piece {p.index} ({p.describe()}) has no record in {workdir}; "
                             f"a rank failed: rerun the same command to finish")
        records.append(json.loads(rec.read_text(encoding="utf-8")))
    finals = _final_locations(prefix, records)
    if not finals:
        skipped = Counter(extra_skipped)
        for rec in records:
            skipped.update(rec["skipped"])
        raise SystemExit(f"error: the inputs hold no documents (skipped: {dict(skipped) or 'nothing'}); check "
                         f"--input and --json-key. {workdir} is kept for inspection")
    shards, skipped = [], Counter(extra_skipped)
    root = Path(prefix).parent
    # The previous corpus of this prefix stayed usable until now; from the first rename on, its manifest would name
    # shards that are being replaced, so it goes first (a finalize killed here leaves no manifest: an unfinished run,
    # which rerunning this command finishes).
    mf.manifest_path(prefix).unlink(missing_ok=True)
    for rec in records:
        skipped.update(rec["skipped"])
        from_inputs = _group_shard_inputs(rec)
        for s in rec["shards"]:
            final = finals[s["work_name"]]
            for ext in (".bin", ".idx"):
                work = workdir / (s["work_name"] + ext)
                if work.exists():
                    os.replace(work, final + ext)
                elif not Path(final + ext).exists():
                    raise SystemExit(f"error: {work} vanished before it was renamed to {final + ext}; rerun with "
                                     f"--overwrite")
            piece = rec["piece"]
            where = {"input": piece["path"], "input_range": [piece["start"], piece["end"]]}
            if from_inputs:  # a group: whole inputs, from the first this shard holds documents of
                first, counts = from_inputs.pop(0)
                where = {"input": first, "input_range": [0, None], "input_documents": counts}
            shards.append({"prefix": os.path.relpath(final, root), **where,
                           **{k: s[k] for k in ("documents", "sentences", "tokens", "bin_bytes", "bin_sha256",
                                                "idx_sha256")}})
    # Shards numbered past the end from an earlier, larger run of this prefix are ours and stale, and so are their
    # ERNIE side-cars (a side-car of a shard that is kept stays: the reader checks it against the shard's lengths).
    pattern = re.compile(re.escape(Path(prefix).name) + r"_(\d{5})\.(bin|idx|spans\.json|spans\.npy|spans\.ptr\.npy)$")
    for path in root.iterdir() if root.exists() else []:
        m = pattern.match(path.name)
        if m and int(m.group(1)) >= len(shards):
            path.unlink()
    input_info = [{k: i[k] for k in ("path", "bytes", "mtime_ns") if k in i} for i in inputs]
    manifest = {
        "format": mf.FORMAT, "version": mf.VERSION, "tool_version": __version__,
        # write_manifest stores it relative to the manifest's folder when it lies there or next to it (a corpus
        # folder copied with its tokenizer still finds it); readers resolve it through manifest.tokenizer_dir
        "tokenizer": {"path": os.path.abspath(tokenizer_arg), "fingerprint": tokenizer.fingerprint, "kind": tokenizer.kind,
                      "vocab_size": tokenizer.vocab_size},
        "dtype": settings.dtype, "shards": shards,
        "totals": mf.totals_of(shards, sum(i["bytes"] for i in input_info)),
        "inputs": input_info, "skipped": dict(skipped), "settings": asdict(settings),
    }
    mf.write_manifest(prefix, manifest)
    shutil.rmtree(workdir, ignore_errors=True)
    return mf.read_manifest(prefix)


def _group_shard_inputs(record: dict) -> list[tuple[str, list[int]]]:
    """For the record of a group of inputs: per shard, (its first input, documents it holds from that input and each
    next one in order), from the record's documents per input (``input_documents``) and the shards' document counts:
    a piece writes its inputs' documents in order and a shard takes the next ones, so the split is exact even where
    an input's documents continue in the piece's next shard. An input without documents (all skipped) is counted 0
    in the shard its neighbours' documents went to. Empty for an ordinary piece."""
    piece = record["piece"]
    if not piece.get("more"):
        return []
    paths, left = [piece["path"], *piece["more"]], list(record["input_documents"])
    out, i = [], 0
    for n, shard in enumerate(record["shards"]):
        last = n == len(record["shards"]) - 1
        need, first, counts = shard["documents"], paths[i], []
        while i < len(paths) and (need or last or left[i] == 0):
            take = min(need, left[i])
            counts.append(take)
            need, left[i] = need - take, left[i] - take
            if left[i]:
                break  # this input's documents go on in the next shard
            i += 1
        out.append((first, counts))
    return out


def up_to_date(prefix: str, identity: dict, tokenizer) -> bool:
    """A finished manifest for exactly this command, with its shard files present at their recorded sizes."""
    try:
        old = mf.read_manifest(prefix)
    except (FileNotFoundError, ValueError):
        return False
    same = (old["settings"] == identity["settings"] and old["tokenizer"]["fingerprint"] == tokenizer.fingerprint
            and old["tool_version"] == identity["tool_version"]
            and [(i["path"], i["bytes"]) for i in old["inputs"]] == [(i["path"], i["bytes"]) for i in identity["inputs"]])
    if not same:
        return False
    # An input is unchanged when its size and modification time (mtime_ns) are the ones recorded when the corpus was
    # planned: equality, not "older than the manifest", so a file edited on a node whose clock is behind, or copied
    # over with its old time kept (cp -p, rsync -a), is rebuilt, and a clock ahead does not rebuild a corpus in use.
    # A manifest written before inputs recorded their mtime_ns keeps the old rule: an input modified after the
    # manifest file was written is changed (builtin:pydocs has no mtime either way).
    written = mf.manifest_path(prefix).stat().st_mtime_ns
    for recorded, now in zip(old["inputs"], identity["inputs"]):
        if recorded.get("mtime_ns") is not None:
            if recorded["mtime_ns"] != now.get("mtime_ns"):
                return False
        elif now.get("mtime_ns", 0) > written:
            return False
    root = mf.manifest_path(prefix).parent
    for s in old["shards"]:
        bin_path, idx_path = root / (s["prefix"] + ".bin"), root / (s["prefix"] + ".idx")
        if not (bin_path.exists() and idx_path.exists() and bin_path.stat().st_size == s["bin_bytes"]
                and idx_path.stat().st_size == mf.idx_bytes(s["sentences"], s["documents"])):
            return False
    return True


def same_unfinished_run(workdir: Path, identity: dict) -> bool:
    """Whether ``workdir`` holds a run of this very command (a finalize stopped after its manifest was written: go
    on and finish it), as opposed to none or another command's (which an up-to-date corpus leaves alone)."""
    try:
        plan = json.loads((workdir / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return plan == json.loads(json.dumps(identity))


# ---------------------------------------------------------------------------------------------------- rebuilding


def rebuild_command(prefix: str | os.PathLike, manifest: dict) -> str:
    """The ``build_indexed`` command line that writes this corpus again (its inputs, tokenizer and recorded
    settings; rerunning it rebuilds what no longer matches the manifest). A manifest that records no inputs
    (hand-made corpora) gets a placeholder."""
    st = manifest.get("settings") or {}
    inputs = " ".join(i["path"] for i in manifest.get("inputs") or []) or "INPUTS"
    tokenizer = (manifest.get("tokenizer") or {}).get("path") or "TOKENIZER_DIR"
    out = str(prefix)[: -len(mf.SUFFIX)] if str(prefix).endswith(mf.SUFFIX) else str(prefix)
    parts = ["python -m data_prep.build_indexed", f"--input {inputs}", f"--tokenizer {tokenizer}",
             f"--output-prefix {out}"]
    mb = 1 << 20
    if st.get("split_sentences"):
        parts.append("--split-sentences")
    if st.get("json_key", "text") != "text":
        parts.append(f"--json-key {st['json_key']}")
    total_in = sum(i.get("bytes", 0) for i in manifest.get("inputs") or [])
    flags = [("chunk_bytes", "--chunk-size-mb", auto_chunk_bytes(total_in)), ("shard_bytes", "--shard-size-mb", 512 * mb),
             ("max_line_bytes", "--max-line-mb", sources.MAX_LINE_BYTES),
             ("max_document_bytes", "--max-document-mb", sources.MAX_DOCUMENT_BYTES)]
    for key, flag, default in flags:
        if key in st and st[key] != default:
            parts.append(f"{flag} {st[key] / mb:g}")
    if "shard_sequences" in st and st["shard_sequences"] != 1_000_000:
        parts.append(f"--shard-sequences {st['shard_sequences']}")
    return " ".join(parts)
