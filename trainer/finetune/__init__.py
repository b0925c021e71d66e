"""Fine-tuning on GLUE-style tasks (``python -m trainer.finetune``) and downstream scores during pretraining.

tasks.py (GLUE's layouts, tsv), metrics.py (scikit-learn/scipy), config.py (the YAML sections), model.py (checkpoint
-> encoder + classification head), run.py (one run through the DeepSpeed engine), sweep.py (grid, seeds, medians),
downstream.py (the pretraining run's ``eval.downstream`` launcher). Beyond GLUE: kinds.py (the task registry),
squad.py + squad_metrics.py (span extraction), ner.py + conlleval.py (token classification), multiple_choice.py (RACE,
SWAG), jsonl.py (CLUE's JSON lines), heads.py (Hugging Face's task heads and the export of a fine-tuned model),
predictions.py (prediction files for the official scorers and leaderboards), ranking.py (MRR for answer selection).
Importing the package imports nothing.
"""
