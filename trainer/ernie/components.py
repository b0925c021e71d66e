"""The model, objective and data of an ERNIE run, in the shape ``trainer.pretrain`` takes (``Components``).

``trainer/pretrain.py`` trains ERNIE 1.0 and 2.0 like every other model: the registry routes ``ernie`` / ``ernie2`` to
``trainer/objectives/ernie*.py``, whose ``build_components`` calls ``ernie_components`` here. Batches come from
``trainer/ernie/data.py`` through ``trainer.data``'s batch sampler and DataLoader.
"""
from __future__ import annotations

from data_prep.manifest import tokenizer_dir
from data_prep.tokenizer import load_tokenizer
from trainer.data.dataset import cache_policy
from trainer.data.loader import build_dataloader
from trainer.ernie.continual import ContinualPlan, EvalPlan
from trainer.ernie.data import ErnieCollator, KnowledgeMaskedDataset, MultiTaskDataset
from trainer.ernie.dlm import dlm_dialogues
from trainer.ernie.tasks import PairTaskFile
from trainer.log import print0
from trainer.loop import Components
from trainer.flops import train_flops


def build_dataset(cfg, tokenizer, objective, split: str = "train", global_batch: int | None = None):
    """The ERNIE dataset of a run config and its objective -> (dataset, continual plan or None).

    ``split="valid"`` reads ``data.valid_corpora``: rows masked at the last knowledge-masking stage's level; ERNIE 2.0
    batches follow ``EvalPlan`` (every task in turn), ERNIE 1.0's DLM batches come from ``dlm.valid_path`` (none
    without it). ``global_batch`` is the positions per step (evaluation: micro batch x ranks, one step per batch)."""
    opt = objective.options
    G = global_batch or cfg.train.global_batch_size
    if objective.name == "ernie2":
        plan = ContinualPlan(opt.continual)
        if split == "train" and cfg.train.steps > plan.total_steps:
            raise ValueError(f"train.steps = {cfg.train.steps} but the continual plan has {plan.total_steps} steps "
                             f"(the tasks' iterations); lower train.steps or raise iterations:\n{plan.describe()}")
        pairs = {name: PairTaskFile(getattr(opt, name).path, getattr(opt, name).labels, tokenizer.encode)
                 for name in ("discourse", "ir_relevance") if getattr(opt, name) is not None}
        rows = plan if split == "train" else EvalPlan(opt.continual)
        return MultiTaskDataset(cfg.data, tokenizer, cfg.seed, split, opt.knowledge_masking, G, rows,
                                opt.reorder_max_pieces, pairs, opt.token_document_max_tokens,
                                opt.capitalization_lowercase_share), plan
    dlm = opt.dlm
    # the same cache file `python -m trainer.data.build_index` builds ahead of the job (dlm_dialogues)
    dialogues = dlm_dialogues(dlm, tokenizer, split, cache_policy(cfg.data))
    dataset = KnowledgeMaskedDataset(cfg.data, tokenizer, cfg.seed, split, opt.knowledge_masking, G, dialogues,
                                dlm.every if dialogues else 0, dlm.num_turns if dlm else 3,
                                dlm.fake_prob if dlm else 0.5, nsp=opt.nsp)
    return dataset, None


def eval_repeat(cfg, valid, global_batch: int) -> str:
    """The note ``trainer.pretrain`` prints when one evaluation (train.eval_batches x the global batch) reads more
    samples than the held-out data holds, for ERNIE's evaluation set ("" when it does not): its corpus steps read
    ``data.valid_corpora`` in order (``len(valid)`` samples, then the same again), ERNIE 1.0's DLM steps draw from
    ``dlm.valid_path``'s dialogues, ERNIE 2.0's labelled-pair steps from the task's pair file. The count given to
    the note is the most distinct samples an evaluation can read: each part's reads capped at what it holds."""
    from trainer.pretrain import eval_repeat_note  # noqa: PLC0415 (the generic path's note, one wording)

    steps = cfg.train.eval_batches
    corpus_steps = valid.corpus_steps_before(steps)
    parts = [(corpus_steps * global_batch, len(valid), "held-out corpus rows from the {} samples of "
                                                           "data.valid_corpora")]
    dialogues = getattr(valid, "dialogues", None)
    if dialogues is not None and getattr(valid, "dlm_every", 0) > 0:
        parts.append(((steps - corpus_steps) * global_batch, len(dialogues),
                      "DLM rows from the {} dialogues of objective.options.dlm.valid_path"))
    elif steps > corpus_steps:  # ERNIE 2.0: rows of the labelled-pair tasks, each from its own file
        formats = valid.plan.formats
        for name, pairs in getattr(valid, "pair_files", {}).items():
            reads = sum(1 for step in range(steps) if valid._sentence_task(set(formats[step % len(formats)])) == name)
            parts.append((reads * global_batch, len(pairs),
                          f"{name} rows from the {{}} labelled pairs of objective.options.{name}.path"))
    reads = sum(r for r, _, _ in parts)
    distinct = sum(min(r, held) for r, held, _ in parts if r)
    if reads == 0 or distinct >= reads:
        return ""
    detail = "; ".join(f"{r} {what.format(held)}" for r, held, what in parts if r)
    return f"{eval_repeat_note(cfg, distinct)} [ERNIE: one evaluation reads {detail}]"


def ernie_components(cfg, rank: int, world_size: int, device: str, objective) -> Components:
    """``objective``: the run's ``ErnieObjective`` or ``Ernie2Objective`` (``trainer.objectives.get_objective``)."""
    model = objective.build_model(cfg.model)
    tokenizer = load_tokenizer(tokenizer_dir(cfg.data.corpora[0].prefix))
    dataset, plan = build_dataset(cfg, tokenizer, objective, "train")
    if plan is not None:
        print0("ERNIE 2.0 continual plan:\n" + plan.describe())
    collate = ErnieCollator(tokenizer.pad_id, objective.options.knowledge_masking.max_predictions_per_seq)
    G, micro = cfg.train.global_batch_size, cfg.train.micro_batch_size

    def train_batches(consumed_samples: int, end_samples: int):
        return iter(build_dataloader(dataset, collate, consumed_samples, G, micro, rank, world_size,
                                     end_samples, cfg.data.num_workers, cfg.data.prefetch_factor))

    eval_batches = None
    if cfg.data.valid_corpora:
        # A fixed set at any world size: positions [0, eval_batches x G) of the held-out data, G (the global batch)
        # per evaluation step, each step of one kind (task, DLM or not), split over the ranks as a training step is
        # (G / world positions per rank, in micro-batches). Before, a step was one micro-batch per rank, so the set
        # was eval_batches x micro x world positions: a resume at another world size changed it.
        per_eval = cfg.train.eval_batches * G
        valid, _ = build_dataset(cfg, tokenizer, objective, "valid", global_batch=G)
        if cfg.train.eval_every:
            note = eval_repeat(cfg, valid, G)
            if note:
                print0(note)
        formats = getattr(valid.plan, "formats", None) if plan is not None else None
        if formats and cfg.train.eval_batches < len(formats):
            print0(f"warning: train.eval_batches = {cfg.train.eval_batches} evaluates only the first "
                   f"{cfg.train.eval_batches} of the {len(formats)} ERNIE 2.0 batch kinds {formats}; "
                   f"set it to a multiple of {len(formats)} to measure every task")

        def eval_batches():
            return build_dataloader(valid, collate, 0, G, micro, rank, world_size, per_eval, 0)

    flops = train_flops(model, cfg.data.max_seq_length, objective.options.knowledge_masking.max_predictions_per_seq)
    return Components(model=model, loss=objective.loss, train_batches=train_batches, eval_batches=eval_batches,
                      flops_per_token=flops.per_token, attention_flops=flops.per_square)
