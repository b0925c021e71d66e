"""ERNIE 1.0 and 2.0: knowledge masking, the dialogue language model, ERNIE 2.0's task labelers and the continual
multi-task schedule. Objectives built on these live in ``trainer/objectives/ernie*.py``."""
