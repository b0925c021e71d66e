"""Misconfigurations of production recipes that used to fail late (hours in, in a child's log) or never (a no-op
setting, a schedule at lr 0): each is refused by the config check (exit 2 naming the key, also under --check), or
said at start. And the other side: what a resume of a run in flight feeds back (its resolved config.json) and every
valid variant still loads. No process groups, no torch in the checks: milliseconds each."""
from __future__ import annotations

import json

import pytest

from trainer.config import ConfigError, config_from_dict, load_config, start_notes
from trainer.optim.schedules import WarmupDecay
from trainer.pretrain import main

NUMS = ["model.vocab_size=1024", "model.pad_token_id=1"]  # what `auto` would read from a corpus's tokenizer


def refused(recipe: str, *sets: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(recipe, [*NUMS, *sets])
    return str(err.value)


def check(capsys, recipe: str, *sets: str) -> tuple[int, str]:
    """``python -m trainer.pretrain --config RECIPE --check`` in process: (exit status, stderr)."""
    argv = ["--config", recipe, "--check"]
    for s in [*NUMS, *sets]:
        argv += ["--set", s]
    status = main(argv)
    return status, capsys.readouterr().err


# --- 1. the learning-rate schedule against train.steps ---------------------------------------------------------

def test_a_decay_that_ends_before_train_steps_at_lr_0_is_refused_with_the_arithmetic(capsys):
    sets = ["train.steps=6", "schedule.warmup_steps=2", "schedule.decay_steps=3"]
    cfg = load_config("roberta_large", NUMS[:2] + ["train.steps=6", "schedule.warmup_steps=2"])
    curve = WarmupDecay(cfg.schedule.model_copy(update={"decay_steps": 3}), 6)
    assert [curve(s) for s in (4, 5, 6)] == [0.0, 0.0, 0.0]  # what the run trained with before this check
    status, err = check(capsys, "roberta_large", *sets)
    assert status == 2, err
    assert "schedule.decay_steps=3 is before train.steps=6" in err and "steps 4-6 (3 steps) would train at lr 0" in err
    assert "Remove schedule.decay_steps" in err and "schedule.end_ratio" in err
    # the 500k-minus-warmup mistake: decay_steps is where the decay ends, so the decay meant is warmup + it
    msg = refused("roberta_large", "schedule.decay_steps=476000")
    assert "steps 476001-500000 (24000 steps) would train at lr 0" in msg, msg


@pytest.mark.parametrize("sets", [["schedule.decay_steps=400000", "schedule.end_ratio=0.1"],  # a deliberate floor
                                  ["schedule.decay_steps=500000"], ["schedule.decay_steps=600000"]])
def test_a_decay_with_a_floor_or_that_reaches_train_steps_loads(sets):
    load_config("roberta_large", [*NUMS, *sets])


def test_a_warmup_longer_than_the_run_is_said_at_start_and_by_check(capsys):
    status, err = check(capsys, "roberta_large", "train.steps=1000")  # warmup 30000 kept
    assert status == 0, err
    assert "schedule.warmup_steps=30000 is not below train.steps=1000: the lr rises to only 0.0333 x optim.lr" in err
    assert start_notes(load_config("roberta_large", NUMS)) == []


# --- 2. eval.downstream, checked as the fine-tuning child reads it ----------------------------------------------

def downstream(tmp_path, **entry) -> list[str]:
    (tmp_path / "RTE").mkdir(exist_ok=True)
    item = {"task": "rte", "data": str(tmp_path / "RTE"), "every_steps": 3, **entry}
    return [f"eval.downstream={json.dumps([item])}"]


def test_a_downstream_task_typo_is_refused_at_check(tmp_path, capsys):
    status, err = check(capsys, "roberta_large", *downstream(tmp_path, task="rtee"))
    assert status == 2 and "eval.downstream.0.task='rtee': no such fine-tuning task" in err and "rte" in err, err


def test_a_bad_key_or_value_in_a_downstream_set_is_refused_naming_it(tmp_path):
    msg = refused("roberta_large", *downstream(tmp_path, set=["optim.lrr=3e-5"]))
    assert "eval.downstream.0 (task rte)" in msg and "optim.lrr" in msg and "unknown key" in msg, msg
    msg = refused("roberta_large", *downstream(tmp_path, sweep=["train.epochs=2,-1"]))
    assert "train.epochs" in msg, msg
    msg = refused("roberta_large", *downstream(tmp_path, set=["task.metrics=[pearson]"]))
    assert "do not apply to rte" in msg, msg


def test_a_missing_downstream_data_folder_or_config_file_is_refused(tmp_path):
    msg = refused("roberta_large", *downstream(tmp_path, data=str(tmp_path / "nope")))
    assert f"eval.downstream.0.data={tmp_path / 'nope'}: no such folder" in msg, msg
    msg = refused("roberta_large", *downstream(tmp_path, config=str(tmp_path / "ft.yaml")))
    assert "ft.yaml" in msg, msg


def test_valid_downstream_entries_load(tmp_path):
    (tmp_path / "ft.yaml").write_text("optim: {lr: 2.0e-5}\n")
    cfg = load_config("roberta_large", [*NUMS, *downstream(tmp_path, task="SST2", set=["optim.lr=3e-5"],
                                                           sweep=["train.epochs=2,3"], seeds=2,
                                                           config=str(tmp_path / "ft.yaml"))])
    assert cfg.eval.downstream[0].task == "SST2"


# --- 4. settings that have no effect under the recipe -----------------------------------------------------------

@pytest.mark.parametrize("recipe, setting, why", [
    ("roberta_large", "optim.max_trust_ratio=10", "optim.name=adamw"),
    ("roberta_large", "optim.bias_correction=false", "optim.name=adamw"),
    ("roberta_large", "schedule.power=2.0", "schedule.kind=linear"),
    ("roberta_large", "data.nsp_negative_prob=0.3", "data.format=full-sentences"),
    ("bert_base", "data.pack_doc_sentences=true", "data.format=segment-pair"),
    ("roberta_large", "data.masking.span_p=0.3", "data.masking.strategy=token"),
    ("albert_xxlarge", "data.masking.span_p=0.3", "data.masking.strategy=ngram"),
    ("roberta_large", "data.masking.max_ngram=4", "data.masking.strategy=token"),
])
def test_a_setting_without_effect_is_refused_saying_why(recipe, setting, why):
    msg = refused(recipe, setting)
    key = setting.split("=")[0]
    assert f"{key}=" in msg and f"has no effect under {why}" in msg and "remove it" in msg, msg


@pytest.mark.parametrize("recipe, setting", [
    ("albert_xxlarge", "optim.max_trust_ratio=10"),  # lamb reads both
    ("bert_base_phase1", "optim.bias_correction=false"),
    ("albert_xxlarge", "schedule.power=2.0"),  # polynomial
    ("roberta_large", "optim.bias_correction=true"),  # defaults, as a resolved config.json holds them
    ("roberta_large", "schedule.power=1"),
    ("roberta_large", "data.masking.max_ngram=3"),
    ("albert_xxlarge", "data.masking.max_ngram=4"),
    ("bert_base", "data.nsp_negative_prob=0.3"),  # NSP pairs
    ("electra_small", "data.nsp_negative_prob=0.0"),  # sop-pair: the single-segment layout
    # a shipped recipe's own value under a kind or optimizer the user chose over it: overridden knowingly
    ("bert_base_phase1", "schedule.kind=linear"),  # the recipe's power 0.5
    ("albert_xxlarge", "optim.name=adamw"),  # the recipe's LAMB settings
    # constant: the kind says there is no decay, so the decay's settings left from a linear config are moot
    ("roberta_large", "schedule.kind=constant"),
])
def test_a_setting_with_effect_or_left_at_its_default_loads(recipe, setting):
    cfg = load_config(recipe, [*NUMS, setting])
    config_from_dict(json.loads(cfg.model_dump_json()))  # and a resume of that run (its resolved config.json)


@pytest.mark.parametrize("recipe", ["roberta_large", "albert_xxlarge", "bert_base_phase1", "electra_small",
                                    "ernie2_base"])
def test_a_resolved_config_of_a_run_in_flight_still_loads(recipe, tmp_path):
    """A resume may feed back RUN_DIR/config.json: every field, defaults included, and no model preset."""
    cfg = load_config(recipe, NUMS)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    assert load_config(str(path)) == cfg


# --- 5. paths read at start ------------------------------------------------------------------------------------

def test_a_missing_init_from_is_refused_at_check(capsys, tmp_path):
    status, err = check(capsys, "roberta_large", f"checkpoint.init_from={tmp_path / 'nope'}")
    assert status == 2 and f"checkpoint.init_from={tmp_path / 'nope'} does not exist" in err, err
    (tmp_path / "empty").mkdir()
    msg = refused("roberta_large", f"checkpoint.init_from={tmp_path / 'empty'}")
    assert "is not a trainer checkpoint" in msg, msg


def test_init_from_a_checkpoint_a_model_or_hf_folder_loads_and_a_resume_ignores_it(tmp_path):
    ckpt = tmp_path / "run1" / "checkpoints" / "global_step8"
    ckpt.mkdir(parents=True)
    (ckpt / "bertfamily.json").write_text("{}")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for source in (ckpt, ckpt.parent, hf):
        load_config("roberta_large", [*NUMS, f"checkpoint.init_from={source}"])
    # a run that resumes (a complete checkpoint of its own) ignores init_from: its source may be gone by then
    own = tmp_path / "run2" / "checkpoints" / "global_step3"
    own.mkdir(parents=True)
    (own / "bertfamily.json").write_text("{}")
    load_config("roberta_large", [*NUMS, f"run_dir={tmp_path / 'run2'}", f"checkpoint.init_from={tmp_path / 'gone'}"])


def test_a_missing_dlm_path_is_refused_and_a_recipes_placeholder_is_said(tmp_path, capsys):
    status, err = check(capsys, "tiny_ernie", f"objective.options.dlm.path={tmp_path / 'd.jsonl'}")
    assert status == 2 and f"objective.options.dlm.path={tmp_path / 'd.jsonl'}: no such file" in err, err
    (tmp_path / "d.jsonl").write_text('{"turns": ["a", "b", "c"]}\n')
    load_config("tiny_ernie", [*NUMS, f"objective.options.dlm.path={tmp_path / 'd.jsonl'}"])
    # the shipped recipe's own placeholder (data/dialogues.jsonl) passes --check, which says it
    status, err = check(capsys, "ernie_base")
    assert status == 0 and "objective.options.dlm.path=data/dialogues.jsonl: no such file" in err, err
    assert "the recipe's placeholder" in err
    resolved = load_config("ernie_base", NUMS).model_dump(mode="json")
    config_from_dict(resolved)  # its resolved config (recipe: ernie_base) too
    with pytest.raises(ConfigError, match="objective.options.dlm.path"):  # the same value in a config of one's own
        config_from_dict({**resolved, "recipe": "mine"})


def test_a_launch_with_a_recipes_placeholder_path_still_missing_stops_before_start_up(tmp_path, capsys):
    """ernie_base's own objective.options.dlm.path (data/dialogues.jsonl) passes --check (every recipe must, in a
    checkout without data) with a note; a launch that still lacks the file stops with exit 2 naming the key before
    any process group or model (it ended in a FileNotFoundError traceback after start-up)."""
    sets = [f"run_dir={tmp_path / 'run'}"]
    argv = ["--config", "tiny_ernie"] + [x for s in [*NUMS, *sets] for x in ("--set", s)]
    assert main(argv + ["--check"]) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: objective.options.dlm.path=data/dialogues.jsonl: no such file" in err, err
    assert not (tmp_path / "run").exists()


def test_a_users_recipe_on_a_shipped_base_passes_what_it_inherits_and_not_what_it_writes(tmp_path):
    """A file with `base: bert_base_phase1` and a linear schedule inherits the base's power 0.5: refused before, with
    "remove it" for a key the file does not have (and so at the next launch of a run in flight started with it;
    found by the diff review). A power the file writes itself is still refused."""
    mine = tmp_path / "my_bert.yaml"
    mine.write_text("base: bert_base_phase1\nschedule: {kind: linear}\n")
    assert load_config(str(mine), NUMS).schedule.power == 0.5
    mine.write_text("base: bert_base_phase1\nschedule: {kind: linear, power: 2.0}\n")
    with pytest.raises(ConfigError, match=r"schedule\.power=2\.0 has no effect under schedule\.kind=linear"):
        load_config(str(mine), NUMS)


def test_a_users_recipe_on_a_shipped_base_still_needs_the_bases_placeholder_paths(tmp_path):
    """Only a shipped recipe's own placeholder passes --check (every recipe must, in a checkout without data); a
    user's file with `base: bert_base_phase2` that leaves init_from at the base's phase-1 folder is refused at --check,
    as before the base-chain exemption (9e2d788 let it through to fail at the job's start; second diff review)."""
    mine = tmp_path / "phase2.yaml"
    mine.write_text(f"base: bert_base_phase2\nrun_dir: {tmp_path / 'run'}\n")
    with pytest.raises(ConfigError, match=r"checkpoint\.init_from=runs/bert_base_phase1/checkpoints does not exist"):
        load_config(str(mine), NUMS)
    load_config("bert_base_phase2", NUMS)  # the shipped recipe itself: a note, not a refusal
