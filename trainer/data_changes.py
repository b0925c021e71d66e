"""What a resume changes in the data the run reads: compared with the checkpoint, said with counts, never refused.

The stream is a pure function of the settings (trainer/data/order.py): position -> corpus by the blend of the
CURRENT weights, corpus stream position -> (epoch, sample) by an order seeded with ``seed + 7919 x corpus index``,
samples from each corpus's sample index (format, lengths, index seed, held-out split) and masked by keys that hold the
corpus index. Nothing remembers how far each corpus was read, so a resume with other data settings silently re-reads
or skips samples (review: weights 0.5/0.3/0.2 -> 0.2/0.3/0.5 at position 480 re-read 96 samples of A and skipped 144
of C; at RoBERTa scale, step 50k x 8192, CC-News 0.47 -> 0.30 re-read 69.6M samples). A changed mixture is often
meant, so this does not refuse: it prints one note per change on rank 0, with what it does to the data and the
``--set`` (or recipe edit) that restores the checkpoint's setting.

What is compared: the checkpoint's resolved config (``bertfamily.json``: data.corpora, data.blend_period, the fields
that define samples, data.valid_split, seed) and, per corpus, a fingerprint of its manifest's shards (name and the
sha256 of both files, which the manifest holds: no data is read), saved by ``checkpoint.save`` as ``data_corpora``.
Checkpoints saved before it have none: their corpora cannot be checked for a rebuild, the config still is, and
nothing is said about the missing record (a resume with unchanged settings prints nothing new).

Cost: the fingerprints are a read of each manifest at start (rank 0); the counts build two blend patterns (10 bytes per
slot of data.blend_period) only when data.corpora or data.blend_period changed.
"""
from __future__ import annotations

import hashlib

import numpy as np

SAMPLE_FIELDS = ("format", "max_seq_length", "short_seq_prob", "nsp_negative_prob", "pack_doc_sentences",
                 "index_seed")
"""data fields that define each corpus's sample index: another value builds other samples at every position"""

_SEEN: dict[str, dict | None] = {}
"""prefix -> its fingerprint as this process first read it (at start): what the run's saves record"""


def corpus_fingerprint(prefix: str) -> dict | None:
    """{"fingerprint", "shards": [16-hex digest per shard], "documents"} of a corpus's manifest; None when it cannot
    be read (a stand-in's corpus, a manifest gone): nothing to compare then."""
    if prefix in _SEEN:
        return _SEEN[prefix]
    try:
        from data_prep.manifest import read_manifest  # noqa: PLC0415
        shards = read_manifest(prefix)["shards"]
        digests = [hashlib.sha256(f"{s['prefix'].rsplit('/', 1)[-1]} {s['bin_sha256']} {s['idx_sha256']}".encode())
                   .hexdigest()[:16] for s in shards]
        record = {"fingerprint": hashlib.sha256(" ".join(digests).encode()).hexdigest()[:16], "shards": digests,
                  "documents": int(sum(int(s["documents"]) for s in shards))}
    except Exception:  # noqa: BLE001  (a missing or foreign manifest is refused by the data path itself)
        record = None
    _SEEN[prefix] = record
    return record


def saved_record(config: dict) -> list[dict]:
    """The ``data_corpora`` entry of a checkpoint state: each training corpus's prefix and fingerprint."""
    corpora = ((config or {}).get("data") or {}).get("corpora") or []
    return [{"prefix": str(c.get("prefix")), **(corpus_fingerprint(str(c.get("prefix"))) or {})} for c in corpora]


def _heldout_counts(prefix: str, old: float, new: float, changed_shards: set | None = None) -> tuple[int, int, int]:
    """(held out at ``new`` and trained at ``old`` -- or lying in ``changed_shards``, total held out at ``new``,
    held out at ``old`` and trained at ``new``) over the corpus's current manifest (8 bytes per document of one
    shard while it runs)."""
    from pathlib import Path  # noqa: PLC0415

    from data_prep.manifest import read_manifest  # noqa: PLC0415
    from trainer.data.heldout import held_out_mask, shard_key  # noqa: PLC0415
    was_training = total = now_training = 0
    for s in read_manifest(prefix)["shards"]:
        name = Path(s["prefix"]).name
        key, docs = shard_key(name), int(s["documents"])
        now = held_out_mask(key, docs, new)
        total += int(now.sum())
        if changed_shards is not None:
            digest = hashlib.sha256(f"{name} {s['bin_sha256']} {s['idx_sha256']}".encode()).hexdigest()[:16]
            was_training += int(now.sum()) if digest in changed_shards else 0
        else:
            before = held_out_mask(key, docs, old)
            was_training += int((now & ~before).sum())
            now_training += int((before & ~now).sum())
    return was_training, total, now_training


def _weights(corpora: list[dict]) -> str:
    return "/".join(f"{c['weight']:g}" for c in corpora)


def _blend_positions(corpora: list[dict], period: int, position: int) -> np.ndarray:
    from trainer.data.order import Blend  # noqa: PLC0415
    return Blend([float(c.get("weight", 1.0)) for c in corpora], period).read_before(position)


def resume_data_notes(resume_dir, cfg, rank: int) -> list[str]:
    """pretrain.py's call at every start: on rank 0, record this launch's corpus fingerprints (for its saves) and,
    on a resume, the notes for what changed since ``resume_dir``; [] elsewhere."""
    if rank != 0:
        return []
    from trainer.checkpoint_files import read_state  # noqa: PLC0415
    return data_change_notes(read_state(resume_dir) if resume_dir is not None else None, cfg, str(resume_dir))


def data_change_notes(saved: dict | None, cfg, where: str = "the checkpoint") -> list[str]:
    """The lines to print (rank 0) for a resume from ``saved`` (a checkpoint's state) under ``cfg``; [] when nothing
    that defines the data changed. Also records this launch's corpus fingerprints for its saves (``saved`` None: a
    fresh start)."""
    new_data = cfg.data.model_dump(mode="json")
    current = {str(c["prefix"]): corpus_fingerprint(str(c["prefix"])) for c in new_data["corpora"]}
    if not saved:
        return []
    old_cfg = saved.get("config") or {}
    old_data = old_cfg.get("data") or {}
    if not old_data:
        return []
    position = int(saved.get("consumed_samples", 0))
    at = f"at position {position:,}"
    notes = []

    def changed(key: str, old, new) -> bool:
        return old is not None and old != new

    if changed("seed", old_cfg.get("seed"), cfg.seed):
        notes.append(f"resume: data: seed {old_cfg['seed']} -> {cfg.seed}: every corpus's epoch order and every "
                     f"sample's masking are redrawn from {at} on: samples already read this epoch will be read again "
                     f"and others not at all (restore: --set seed={old_cfg['seed']})")
    for key in SAMPLE_FIELDS:
        if changed(key, old_data.get(key), new_data[key]):
            notes.append(f"resume: data: data.{key} {old_data[key]} -> {new_data[key]}: every corpus's sample index "
                         f"is rebuilt, so from {at} on the stream reads other samples in a new order (what was read "
                         f"before may be read again or skipped) (restore: --set data.{key}={old_data[key]})")
    old_mask, new_mask = old_data.get("masking") or {}, new_data["masking"]
    for key in sorted(old_mask):
        if key in new_mask and changed(key, old_mask[key], new_mask[key]):
            notes.append(f"resume: data: data.masking.{key} {old_mask[key]} -> {new_mask.get(key)}: samples are "
                         f"masked differently from {at} on (the order is unchanged) (restore: --set "
                         f"data.masking.{key}={old_mask[key]})")

    old_list = [{"prefix": str(c.get("prefix")), "weight": float(c.get("weight", 1.0))}
                for c in old_data.get("corpora") or []]
    new_list = [{"prefix": str(c["prefix"]), "weight": float(c["weight"])} for c in new_data["corpora"]]
    old_period = int(old_data.get("blend_period", new_data["blend_period"]))
    new_period = int(new_data["blend_period"])
    restore_list = ("(restore: the checkpoint's data.corpora, in its order, in the recipe or --set data.corpora=[...]; "
                    f"{where}/bertfamily.json holds it)")
    if old_list and (old_list != new_list or old_period != new_period):
        old_read = _blend_positions(old_list, old_period, position)
        new_read = _blend_positions(new_list, new_period, position)
        old_at = {c["prefix"]: i for i, c in enumerate(old_list)}
        new_at = {c["prefix"]: j for j, c in enumerate(new_list)}
        same_list = [c["prefix"] for c in old_list] == [c["prefix"] for c in new_list]
        if same_list and [c["weight"] for c in old_list] != [c["weight"] for c in new_list]:
            restore = " ".join(f"--set data.corpora.{k}.weight={o['weight']:g}"
                               for k, (o, n) in enumerate(zip(old_list, new_list)) if o["weight"] != n["weight"])
            notes.append(f"resume: data: blend weights {_weights(old_list)} -> "
                         f"{_weights(new_list)} {at} (per corpus below; "
                         f"restore: {restore})")
        if old_period != new_period:
            notes.append(f"resume: data: data.blend_period {old_period} -> {new_period}: the blend pattern changes "
                         f"(counts per corpus below) (restore: --set data.blend_period={old_period})")
        for prefix, i in old_at.items():
            if prefix not in new_at:
                notes.append(f"resume: data: corpus {prefix} (data.corpora.{i}) is no longer read; "
                             f"{int(old_read[i]):,} of its samples were read before {at} {restore_list}")
        for prefix, j in new_at.items():
            n = int(new_read[j])
            if prefix not in old_at:
                notes.append(f"resume: data: corpus {prefix} is new (data.corpora.{j}, weight "
                             f"{new_list[j]['weight']:g}); its stream starts at its position {n:,} (the positions "
                             f"before {at} this blend gives it, never read) {restore_list}")
                continue
            i = old_at[prefix]
            o = int(old_read[i])
            if i != j:
                notes.append(f"resume: data: corpus {prefix} moves from data.corpora.{i} to data.corpora.{j}: its "
                             f"epoch order (seeded by seed + 7919 x its index) and its samples' masking are redrawn: "
                             f"its stream goes on at position {n:,} (it had read {o:,}) of another order, so samples "
                             f"already read this epoch will be read again and others not at all {restore_list}")
            elif n < o:
                notes.append(f"resume: data: corpus {prefix}: the new blend puts its stream {at} at {n:,}, but the "
                             f"run had read {o:,} of it: {o - n:,} samples already read will be read again (the same "
                             f"samples, same masking)")
            elif n > o:
                notes.append(f"resume: data: corpus {prefix}: the new blend puts its stream {at} at {n:,}, but the "
                             f"run had read {o:,} of it: {n - o:,} samples of corpus {prefix} are skipped (never read "
                             f"in their epoch)")

    saved_prints = {str(c.get("prefix")): c for c in saved.get("data_corpora") or [] if c.get("fingerprint")}
    split = float(new_data["valid_split"])
    rebuilt = set()
    for prefix, now in current.items():
        before = saved_prints.get(prefix)
        if before is None or now is None or before["fingerprint"] == now["fingerprint"]:
            continue
        rebuilt.add(prefix)
        changed_shards = set(now["shards"]) - set(before.get("shards") or [])
        note = (f"resume: data: corpus {prefix} was rebuilt since {where} (shards {len(before.get('shards') or [])} "
                f"-> {len(now['shards'])}, of which {len(changed_shards)} new or changed; documents "
                f"{before.get('documents')} -> {now['documents']}): its sample index and epoch order are new, so "
                f"from {at} on its stream reads an order unrelated to the one read so far (samples read before will "
                f"be read again, others skipped)")
        if split > 0:
            trained, total, _ = _heldout_counts(prefix, split, split, changed_shards)
            if trained:
                note += (f"; warning: {trained:,} of its {total:,} held-out documents (data.valid_split={split:g}) "
                         f"lie in new or changed shards and may have been trained on: evaluation loss from here on "
                         f"is not comparable with before and may read training data")
        notes.append(note)
    old_split = old_data.get("valid_split")
    if changed("valid_split", old_split, split):
        for prefix in current:
            if prefix in rebuilt:
                continue
            trained, total, freed = _heldout_counts(prefix, float(old_split), split)
            notes.append(f"resume: data: data.valid_split {old_split} -> {split:g} on {prefix}: "
                         + (f"warning: {trained:,} of the {total:,} documents held out now were training documents "
                            f"before (evaluation reads data the model was trained on); " if trained else "")
                         + f"{freed:,} documents held out before are trained on from {at} on; the training sample "
                           f"index is rebuilt, so the stream reads other samples in a new order (restore: --set "
                           f"data.valid_split={old_split})")
    if changed("valid_corpora", old_data.get("valid_corpora"), new_data["valid_corpora"]):
        notes.append("resume: data: data.valid_corpora changed: evaluation reads other data, so evaluation losses "
                     "before and after the resume are not comparable")
    return notes
