"""NER (trainer/finetune/ner.py, conlleval.py) and the sweep summary over its runs: every entity type reported in
every run, sentences cut at the first word that does not fit (and counted), CoNLL lines split as conlleval does."""
from __future__ import annotations

from trainer.finetune.config import TaskSection
from trainer.finetune.kinds import task_kind
from trainer.finetune.ner import EncodedTags
from trainer.finetune.sweep import format_table, summarize


def _ner(tmp_path, train: str, dev: str):
    (tmp_path / "train.txt").write_text(train)
    (tmp_path / "dev.txt").write_text(dev)
    kind = task_kind(TaskSection(name="ner"))
    return kind, kind.read(tmp_path)


def test_every_entity_type_of_the_label_set_is_reported(tmp_path):
    # MISC occurs in train only: dev neither holds nor (here) predicts it
    kind, splits = _ner(tmp_path, "Paris B-LOC\nJazz B-MISC\n", "Paris B-LOC\nis O\n")
    assert kind.labels == ["O", "B-LOC", "B-MISC"]
    data = EncodedTags([[0] * 4], [[0] * 4], [[0] * 4], [[1, 2]], splits["dev"].tags)
    loc = kind.labels.index("B-LOC")
    scores = kind.score([[0, loc, 0, 0]], data)
    # before: only f1_LOC (conlleval prints the types it meets), so runs of a sweep reported different keys
    assert scores["f1_LOC"] == 1.0 and scores["f1_MISC"] == 0.0
    misc = kind.labels.index("B-MISC")
    assert set(kind.score([[0, loc, misc, 0]], data)) == set(scores)


def test_summary_and_table_take_the_union_of_differing_keys():
    def run(setting, seed, f1, **types):
        return {"setting": setting, "seed": seed, "metrics": {"dev": {"f1": f1, **types}}}
    # results.json of older runs: f1_MISC only where a run predicted MISC
    runs = [run("lr=1", 1, 0.8, f1_LOC=0.9, f1_MISC=0.1), run("lr=1", 2, 0.6, f1_LOC=0.7),
            run("lr=2", 1, 0.9, f1_LOC=0.95)]
    summary = summarize("ner", "f1", runs)  # before: KeyError 'f1_MISC'
    assert summary["settings"]["lr=1"]["dev"] == {"f1": 0.7, "f1_LOC": 0.8, "f1_MISC": 0.1}
    assert summary["best_setting"] == "lr=2"
    table = format_table(summary)
    assert "f1_MISC" in table and table.splitlines()[-1].split()[-1] == "-"
    # the first setting lacking a column the second has (format_table took its columns from the first)
    table = format_table(summarize("ner", "f1", [runs[2], runs[0]]))
    assert "f1_MISC" in table and "10.00" in table


class _Pieces:
    """A tokenizer whose word ``w`` is ``len(w)`` sub-tokens (id 5 each); [CLS] 1, [SEP] 2."""
    cls_id, sep_id = 1, 2

    def encode(self, text):
        return [5] * len(text.strip())


def test_a_sentence_is_cut_at_the_first_word_that_does_not_fit(tmp_path, capsys):
    long = "x" * 29
    kind, splits = _ner(tmp_path, f"a B-PER\n{long} I-PER\nb O\nc B-LOC\n\nd O\n",
                        f"a B-PER\n{long} I-PER\nb O\nc B-LOC\n\nd O\n\ne O\nf O\ng O\nh O\ni O\nj O\nk O\n")
    labels = {t: i for i, t in enumerate(kind.labels)}
    from trainer.finetune.ner import encode_tags
    enc = encode_tags(_Pieces(), splits["train"], labels, 8)
    # max_len 8: [CLS] a (1 piece) then the 29-piece word does not fit; before, b and c were kept after the hole
    assert enc.first == [[1, -1, -1, -1], [1]]
    assert enc.ids[0] == [1, 5, 2] and enc.labels[0] == [-100, labels["B-PER"], -100]
    assert (enc.cut_sentences, enc.cut_words, enc.cut_entities) == (1, 3, 2)  # PER loses a word; LOC is gone
    kind.encode(_Pieces(), splits["dev"], 8, "bert", 2)
    err = capsys.readouterr().err
    assert "warning:" in err and "dev.txt: 2 of 3 sentences cut at 8 tokens" in err and "2 gold entities" in err
    kind.encode(_Pieces(), splits["train"], 64, "bert", 2)
    assert "warning" not in capsys.readouterr().err


def test_a_token_that_is_a_unicode_space_is_a_token(tmp_path):
    from trainer.finetune.ner import read_conll
    # People's Daily / MSRA files hold full-width spaces as characters; before: "1 column(s)" at line 2
    (tmp_path / "zh.txt").write_text("北 B-LOC\n\u3000 O\n京\tI-LOC\n\u00a0 O\n\n长 B-LOC \r\n")
    s = read_conll(tmp_path / "zh.txt")
    assert s.words == [["北", "\u3000", "京", "\u00a0"], ["长"]] and s.tags == [["B-LOC", "O", "I-LOC", "O"], ["B-LOC"]]
