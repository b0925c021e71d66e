"""Packaging for bertfamily: data prep and a DeepSpeed trainer for BERT, RoBERTa, ALBERT, ERNIE and ELECTRA.

torch is declared but must be installed first (``pip install torch==2.13.0`` on CPU machines, or your cluster's CUDA
build) so that the resolver does not pull a multi-GB CUDA wheel; ``make venv`` does this in the right order.
The torch floor is the oldest release the whole suite has passed on (2.11.0, with transformers 5.17.0, on Python
3.11 and 3.12, 2026-12-05; CI runs 2.13.0 on 3.11): older torchruns lack options the Slurm launcher relies on
(``--signals-to-handle``). transformers' floor likewise: 4.57.6 passed the 12 test files that use it (203 tests;
5.17.0 and 5.25.0 the whole suite), and again the 9 that load Hugging Face folders on 2026-12-05 (207 tests).
"""
from setuptools import find_packages, setup

VERSION = "0.1.0"

setup(
    name="bertfamily",
    version=VERSION,
    description="Pretrain BERT, RoBERTa, ALBERT, ERNIE 1.0/2.0 and ELECTRA at cluster scale with one DeepSpeed trainer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["data_prep", "data_prep.*", "trainer", "trainer.*"]),
    package_data={"trainer": ["recipes/*.yaml"]},
    install_requires=[
        "torch>=2.11",
        "deepspeed>=0.16",
        "megatron-core>=0.12",
        "numpy",
        "numba>=0.60",  # the sample index's walk, compiled (trainer/data/index_kernels.py)
        "tokenizers>=0.19",
        "sentencepiece>=0.2",
        "protobuf",  # train_tokenizer --kind unigram reads the SentencePiece model proto
        "pydantic>=2.5",
        "pyyaml",
        "tqdm",
        "tensorboard",
        "safetensors",
        "zstandard",
        "jieba",
        "pyahocorasick",
        "psutil",
    ],
    extras_require={
        "hf": ["transformers>=4.57", "protobuf"],
        "mpi": ["mpi4py>=3.1"],
        "plot": ["matplotlib"],
        # bench/prep.py runs Megatron-LM's tools/preprocess_data.py as its baseline; its tokenizer module imports six
        "bench": ["transformers>=4.57", "six"],
        # GLUE metrics of python -m trainer.finetune; nltk: CMRC 2018 / DRCD F1 splits words as the official script
        "eval": ["scikit-learn>=1.3", "scipy>=1.10", "nltk>=3.8"],
        # pytest < 9.2: pytest-xdist 3.8 groups tests (--dist loadgroup) through an attribute pytest 9.2 renamed
        "dev": ["pytest>=7,<9.2", "pytest-timeout", "pytest-xdist>=3.5", "matplotlib", "transformers>=4.57", "protobuf",
                "scikit-learn>=1.3", "scipy>=1.10", "nltk>=3.8"],
    },
)
