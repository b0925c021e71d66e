"""Downstream tasks: GLUE's nine tasks in GLUE's own file layout, and ``tsv`` for a team's own data.

A task is a row of ``GLUE`` (data, not code paths): which files hold its splits, which columns hold the text(s) and
the label, the label set (None = regression) and the metrics GLUE reports for it. Files are read as GLUE writes them:
tab-separated, no quoting (``csv`` would treat the quotes inside GLUE sentences as field delimiters), a header line
except for CoLA. ``read_split`` validates every line before any training starts: a line with too few columns or an
empty text is named by file and line, a label outside the task's set names the set; blank lines are counted and
reported, never silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class TaskDataError(ValueError):
    """Task files that cannot be used; the message names the file (and line) and what to do."""


def read_text(path: Path) -> str:
    """A task file's text: UTF-8 with or without a byte-order mark (GLUE's MRPC files begin with one)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        line = Path(path).read_bytes()[: err.start].count(b"\n") + 1
        raise TaskDataError(f"{path}:{line}: not valid UTF-8 ({err.reason} at byte {err.start}); convert the file "
                            "to UTF-8") from None


def read_lines(path: Path) -> list[str]:
    """A task file's lines, split where Python's csv reader (GLUE's and BERT's reference readers) splits them: at
    \\n, \\r\\n and \\r only. ``str.splitlines`` would also split inside a text at U+2028, U+0085 or a form feed,
    which occur in real sentences, and break the line into two malformed ones."""
    lines = read_text(path).split("\n")  # read_text's universal newlines already made \r\n and \r into \n
    if lines and lines[-1] == "":
        lines.pop()
    return lines


@dataclass(frozen=True)
class TaskSpec:
    name: str
    train: str
    """File of the training split, relative to the task's data folder."""
    dev: dict[str, str]
    """Evaluation splits: name -> file. The first one's main metric selects the best learning rate."""
    text_a: str | int
    """Column of the first text: a header name, or a 0-based index (files without a header, or duplicated names)."""
    text_b: str | int | None
    label: str | int | None
    """None: the split has no label (test files)."""
    labels: tuple[str, ...] | None
    """Every class, in the order of the classifier's outputs; None = regression (one output, MSE loss)."""
    metrics: tuple[str, ...]
    """Names in ``trainer.finetune.metrics.METRICS``; the first is the task's main score."""
    header: bool = True
    skip_malformed: bool = False
    """Skip (and count) lines with too few columns instead of stopping (``task.skip_malformed``; GLUE's tasks
    too: older QQP downloads hold questions cut by a newline)."""
    group: str | int | None = None
    """Column of the question id the ranking metrics (mrr) group by; None: no such column."""
    test: dict[str, str] = field(default_factory=dict)
    """Unlabelled splits: name -> file. Predicted (and written) by every run, never scored."""

    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.labels else 1

    @property
    def is_regression(self) -> bool:
        return self.labels is None


# GLUE's files as its download script writes them (column names from the files' own header lines).
GLUE: dict[str, TaskSpec] = {
    "cola": TaskSpec("cola", "train.tsv", {"dev": "dev.tsv"}, 3, None, 1, ("0", "1"), ("matthews",), header=False),
    "sst-2": TaskSpec("sst-2", "train.tsv", {"dev": "dev.tsv"}, "sentence", None, "label", ("0", "1"), ("accuracy",)),
    "mrpc": TaskSpec("mrpc", "train.tsv", {"dev": "dev.tsv"}, "#1 String", "#2 String", "Quality", ("0", "1"),
                     ("f1", "accuracy")),
    "sts-b": TaskSpec("sts-b", "train.tsv", {"dev": "dev.tsv"}, "sentence1", "sentence2", "score", None,
                      ("spearman", "pearson")),
    "qqp": TaskSpec("qqp", "train.tsv", {"dev": "dev.tsv"}, "question1", "question2", "is_duplicate", ("0", "1"),
                    ("f1", "accuracy")),
    "mnli": TaskSpec("mnli", "train.tsv", {"matched": "dev_matched.tsv", "mismatched": "dev_mismatched.tsv"},
                     "sentence1", "sentence2", -1, ("contradiction", "entailment", "neutral"), ("accuracy",)),
    "qnli": TaskSpec("qnli", "train.tsv", {"dev": "dev.tsv"}, "question", "sentence", "label",
                     ("entailment", "not_entailment"), ("accuracy",)),
    "rte": TaskSpec("rte", "train.tsv", {"dev": "dev.tsv"}, "sentence1", "sentence2", "label",
                    ("entailment", "not_entailment"), ("accuracy",)),
    "wnli": TaskSpec("wnli", "train.tsv", {"dev": "dev.tsv"}, "sentence1", "sentence2", "label", ("0", "1"),
                     ("accuracy",)),
}
GLUE_TEST: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None), "sst-2": ("sentence", None), "mrpc": ("#1 String", "#2 String"),
    "sts-b": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
"""The text columns of GLUE's test files (a header line each, CoLA's too, then ``index`` or QQP's ``id``; no label)."""
INDEX_COLUMNS = ("index", "id", "idx")
"""Header names (tsv) or fields (jsonl) whose value names a line in a prediction file; else its 0-based position."""
ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-m": "mnli", "mnli-mm": "mnli"}
TASK_NAMES = tuple(GLUE) + ("tsv", "jsonl", "ner", "squad", "race", "swag")


def glue_task(name: str) -> TaskSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in GLUE:
        raise TaskDataError(f"unknown task {name!r}: choose one of {', '.join(TASK_NAMES)} (tsv: columns named in "
                            "the config's task section)")
    return GLUE[key]


def with_metrics(spec: TaskSpec, metrics) -> TaskSpec:
    """A GLUE task scored by ``task.metrics`` instead of GLUE's list (the first selects the best setting: RoBERTa and
    ELECTRA select MRPC and QQP by accuracy, GLUE's list puts F1 first); metrics that cannot apply are refused."""
    from dataclasses import replace

    from trainer.config_error import ConfigError
    kind = "a regression" if spec.is_regression else "classification"
    bad = [m for m in metrics if (m in ("pearson", "spearman")) != spec.is_regression]
    if bad:
        raise ConfigError(f"task.metrics: {bad} do not apply to {spec.name} ({kind}); GLUE reports "
                          f"{list(spec.metrics)}")
    if any(m in ("mrr", "mrr_answerable") for m in metrics):
        raise ConfigError(f"task.metrics: mrr ranks the answers of each question; {spec.name} has no question ids "
                          "(a tsv or jsonl task with task.group has)")
    if "f1" in metrics and spec.num_labels > 2:
        raise ConfigError(f"task.metrics: f1 is binary and {spec.name} has {spec.num_labels} classes; use f1_macro "
                          "or f1_micro")
    return replace(spec, metrics=tuple(metrics))


def tsv_task_spec(t) -> TaskSpec:
    """The spec of a ``task.name: tsv`` section (``trainer/finetune/config.py``'s task fields), its ranking metrics
    checked: what the fine-tuning CLI builds, and what the pretraining config's ``eval.downstream`` check builds."""
    return check_ranking(TaskSpec("tsv", t.train_file, dict(t.dev_files), t.text_a, t.text_b, t.label,
                                  tuple(t.labels) if t.labels else None, tuple(t.metrics or ("accuracy",)), t.header,
                                  t.skip_malformed, t.group, dict(t.test_files)))


def check_ranking(spec: TaskSpec) -> TaskSpec:
    """A tsv/jsonl spec whose ranking metrics can apply: they need classes (the second is a correct answer)."""
    from trainer.config_error import ConfigError
    if spec.is_regression and any(m in ("mrr", "mrr_answerable") for m in spec.metrics):
        raise ConfigError("task.metrics: mrr ranks by the score of the second of task.labels; list the labels "
                          "(e.g. [0, 1])")
    return spec


def test_spec(spec: TaskSpec) -> TaskSpec:
    """How the unlabelled splits are read: GLUE's test layout for a GLUE task, else the task's own columns; no
    label."""
    from dataclasses import replace
    if spec.name in GLUE_TEST:
        a, b = GLUE_TEST[spec.name]
        return replace(spec, text_a=a, text_b=b, label=None, header=True, group=None)
    return replace(spec, label=None)


@dataclass
class Example:
    text_a: str
    text_b: str | None
    label: int | float | None
    """None on an unlabelled (test) split."""
    group: str | None = None
    """The question id (``task.group``), for the ranking metrics."""
    index: str | None = None
    """The line's ``index``/``id`` column, which a GLUE submission file names it by."""


@dataclass
class Split:
    path: Path
    examples: list[Example]
    blank_lines: int = 0
    skipped: list[int] = field(default_factory=list)
    """Line numbers of malformed lines skipped (only with skip_malformed)."""

    def describe(self) -> str:
        extra = []
        if self.blank_lines:
            extra.append(f"{self.blank_lines} blank lines ignored")
        if self.skipped:
            extra.append(f"{len(self.skipped)} malformed lines skipped (first: {self.skipped[:5]})")
        return f"{self.path}: {len(self.examples)} examples" + (f" ({'; '.join(extra)})" if extra else "")


def _column(spec_col: str | int, header: list[str] | None, path: Path, what: str) -> int:
    if isinstance(spec_col, int):
        return spec_col
    if header is None:
        raise TaskDataError(f"{path}: task column {what}={spec_col!r} is a name, but the file is read without a "
                            "header line; give a 0-based index or set task.header: true")
    if spec_col not in header:
        raise TaskDataError(f"{path}:1: the header has no column {spec_col!r} (for {what}); it has {header}")
    return header.index(spec_col)


def read_split(spec: TaskSpec, path: Path) -> Split:
    """Every example of one split file, validated; raises TaskDataError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"task {spec.name}: split file {path} does not exist (expected GLUE's layout: "
                            f"{spec.train} and {', '.join(spec.dev.values())} in the data folder)")
    lines = read_lines(path)
    header = lines[0].split("\t") if spec.header and lines else None
    cols = {what: _column(c, header, path, what) for what, c in (("text_a", spec.text_a), ("text_b", spec.text_b),
                                                                  ("label", spec.label), ("group", spec.group))
            if c is not None}
    index_col = next((header.index(n) for n in INDEX_COLUMNS if header and n in header), None)
    need = max(c + 1 if c >= 0 else -c for c in cols.values())
    label_index = {name: i for i, name in enumerate(spec.labels or ())}
    split = Split(path, [])
    for number, line in enumerate(lines[1:] if header else lines, start=2 if header else 1):
        if not line.strip():
            split.blank_lines += 1
            continue
        fields = line.split("\t")
        if len(fields) < need:
            if spec.skip_malformed:
                split.skipped.append(number)
                continue
            raise TaskDataError(f"{path}:{number}: expected at least {need} tab-separated columns, found "
                                f"{len(fields)} (a stray tab or newline inside a text?)")
        text_a = fields[cols["text_a"]]
        text_b = fields[cols["text_b"]] if "text_b" in cols else None
        if not text_a.strip() or (text_b is not None and not text_b.strip()):
            raise TaskDataError(f"{path}:{number}: empty text in column "
                                f"{spec.text_a if not text_a.strip() else spec.text_b!r}")
        group = fields[cols["group"]].strip() if "group" in cols else None
        index = fields[index_col].strip() if index_col is not None and index_col < len(fields) else None
        if "label" not in cols:  # an unlabelled (test) split
            split.examples.append(Example(text_a, text_b, None, group, index))
            continue
        raw = fields[cols["label"]].strip()
        if spec.labels is None:
            try:
                label: int | float = float(raw)
            except ValueError:
                raise TaskDataError(f"{path}:{number}: label {raw!r} is not a number (task {spec.name} is a "
                                    "regression)") from None
        else:
            if raw not in label_index:
                raise TaskDataError(f"{path}:{number}: label {raw!r} is not in the task's label set "
                                    f"{list(spec.labels)} (for a tsv task, list every class in task.labels)")
            label = label_index[raw]
        split.examples.append(Example(text_a, text_b, label, group, index))
    if not split.examples:
        raise TaskDataError(f"{path}: no examples (an empty split cannot train or evaluate)")
    return split


def read_task(spec: TaskSpec, data_dir: str | Path, reader=None) -> dict[str, Split]:
    """{"train": ..., <dev split name>: ...}: every split read and validated (all missing files named at once).
    ``reader(spec, path)`` reads one file (default: ``read_split``, tab-separated; jsonl passes its own); a
    registered kind (trainer/finetune/kinds.py) reads its own layout."""
    if hasattr(spec, "read"):
        return spec.read(data_dir)
    reader = reader or read_split
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise TaskDataError(f"--data {data_dir}: no such folder (the task's folder, e.g. glue_data/RTE)")
    files = {"train": spec.train, **spec.dev}
    clash = sorted(set(files) & set(spec.test))
    if clash:
        raise TaskDataError(f"task.test_files: {clash} name(s) a training or dev split of {spec.name} "
                            f"({list(files)}); name test splits apart (e.g. test, test_matched)")
    missing = [name for name in [*files.values(), *spec.test.values()] if not (data_dir / name).is_file()]
    if missing:
        raise TaskDataError(f"task {spec.name}: {data_dir} lacks {missing} (GLUE layout: {list(files.values())})")
    unlabelled = test_spec(spec)
    return {**{split: reader(spec, data_dir / name) for split, name in files.items()},
            **{split: reader(unlabelled, data_dir / name) for split, name in spec.test.items()}}
