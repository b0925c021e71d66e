"""Fine-tuning on GLUE-style tasks (``python -m trainer.finetune``) and downstream scores during pretraining.

tasks.py (GLUE's layouts, tsv), metrics.py (scikit-learn/scipy), config.py (the YAML sections), model.py (checkpoint
-> encoder + classification head), run.py (one run through the DeepSpeed engine), sweep.py (grid, seeds, medians),
downstream.py (the pretraining run's ``eval.downstream`` launcher). Importing the package imports nothing.
"""
