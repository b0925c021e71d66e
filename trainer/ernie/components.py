"""The model, objective and data of an ERNIE run, in the shape ``trainer.pretrain`` takes (``Components``).

``trainer.pretrain.main(argv, components_factory=ernie_components, section_models=SECTION_MODELS)`` trains ERNIE
1.0 or 2.0 with the common trainer (engine, checkpoints, resume, logging); ``python -m trainer.ernie.pretrain`` does
exactly that. Batches come from ``trainer/ernie/data.py`` through ``trainer.data``'s batch sampler and DataLoader.
"""
from __future__ import annotations

SECTION_MODELS = {"objective": "trainer.objectives.ernie:ErnieObjectiveConfig"}


def build_objective(obj_cfg):
    if obj_cfg.name == "ernie2":
        from trainer.objectives.ernie2 import Ernie2Objective

        return Ernie2Objective.from_config(obj_cfg)
    from trainer.objectives.ernie import ErnieObjective

    return ErnieObjective.from_config(obj_cfg)


def build_dataset(cfg, tokenizer, split: str = "train"):
    """The ERNIE dataset of a run config (``cfg.objective`` an ErnieObjectiveConfig)."""
    from trainer.ernie.continual import ContinualPlan
    from trainer.ernie.data import KnowledgeMaskedDataset, MultiTaskDataset
    from trainer.ernie.tasks import PairTaskFile

    obj = cfg.objective
    G = cfg.train.global_batch_size
    if obj.name == "ernie2":
        plan = ContinualPlan(obj.continual)
        if cfg.train.steps > plan.total_steps:
            raise ValueError(f"train.steps = {cfg.train.steps} but the continual plan has {plan.total_steps} steps "
                             f"(the tasks' iterations); lower train.steps or raise iterations:\n{plan.describe()}")
        pairs = {name: PairTaskFile(getattr(obj, name).path, getattr(obj, name).labels, tokenizer.encode)
                 for name in ("discourse", "ir_relevance") if getattr(obj, name) is not None}
        return MultiTaskDataset(cfg.data, tokenizer, cfg.seed, split, obj.knowledge_masking, G, plan,
                                obj.reorder_max_pieces, pairs, obj.token_document_max_tokens), plan
    dialogues = None
    if obj.dlm is not None:
        from data_prep.annotate import make_annotator
        from trainer.ernie.dlm import DialogueFile

        annotator = make_annotator(obj.dlm.annotate) if obj.dlm.annotate else None
        dialogues = DialogueFile(obj.dlm.path, tokenizer, annotator, tokenizer.path if annotator else None)
    ds = KnowledgeMaskedDataset(cfg.data, tokenizer, cfg.seed, split, obj.knowledge_masking, G, dialogues,
                                obj.dlm.every if obj.dlm else 0, obj.dlm.num_turns if obj.dlm else 3,
                                obj.dlm.fake_prob if obj.dlm else 0.5)
    return ds, None


def ernie_components(cfg, rank: int, world_size: int, device: str):
    from data_prep.manifest import read_manifest
    from data_prep.tokenizer import load_tokenizer
    from trainer.data.loader import build_dataloader
    from trainer.ernie.data import ErnieCollator
    from trainer.log import print0
    from trainer.loop import Components

    objective = build_objective(cfg.objective)
    model = objective.build_model(cfg.model)
    tokenizer = load_tokenizer(read_manifest(cfg.data.corpora[0].prefix)["tokenizer"]["path"])
    dataset, plan = build_dataset(cfg, tokenizer, "train")
    if plan is not None:
        print0("ERNIE 2.0 continual plan:\n" + plan.describe())
    collate = ErnieCollator(tokenizer.pad_id, cfg.objective.knowledge_masking.max_predictions_per_seq)
    G, micro = cfg.train.global_batch_size, cfg.train.micro_batch_size

    def train_batches(consumed_samples: int):
        return iter(build_dataloader(dataset, collate, consumed_samples, G, micro, rank, world_size,
                                     cfg.train.steps * G, cfg.data.num_workers, cfg.data.prefetch_factor))

    eval_batches = None
    if cfg.data.valid_corpora and plan is None:  # ERNIE 2.0 evaluation would need a task per eval batch: not yet
        valid, _ = build_dataset(cfg, tokenizer, "valid")
        per_eval = cfg.train.eval_batches * micro * world_size

        def eval_batches():
            return build_dataloader(valid, collate, 0, per_eval, micro, rank, world_size, per_eval, 0)

    return Components(model=model, loss=objective.loss, train_batches=train_batches, eval_batches=eval_batches,
                      seq_len=cfg.data.max_seq_length, num_layers=cfg.model.num_layers, hidden=cfg.model.hidden_size)
