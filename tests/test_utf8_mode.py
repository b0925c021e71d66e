"""The entry points under a non-UTF-8 locale (data_prep/utf8_mode.py). Found by review (F2): under zh_CN.GB18030
``build_indexed.py`` could not start (megatron-core imports torch inductor, which read its UTF-8 templates with the
locale's codec) and ``train_tokenizer`` could not save at a non-ASCII path."""
import locale
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GB18030 = "zh_CN.GB18030"


def _has_locale(name: str) -> bool:
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, name)
        return True
    except locale.Error:
        return False
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


def _run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONUTF8", "PYTHONIOENCODING",
                                                                     "BERTFAMILY_UTF8"))}
    env.update(LC_ALL=GB18030)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, timeout=600)


@pytest.mark.skipif(not _has_locale(GB18030), reason=f"the {GB18030} locale is not installed (locale-gen)")
def test_data_prep_runs_under_a_gb18030_locale_at_a_non_ascii_path(tmp_path, zh_corpus):
    """Under LC_ALL=zh_CN.GB18030 with no PYTHONUTF8: the zh tokenizer is saved into a folder named in Chinese, and
    build_indexed.py (megatron-core, torch inductor) builds shards from it; both commands re-exec in UTF-8 mode."""
    probe = _run(["-c", "import sys, locale; print(sys.flags.utf8_mode, locale.getpreferredencoding(False))"],
                 tmp_path)
    assert probe.stdout.split() == [b"0", b"GB18030"], probe  # the locale really is in effect for Python
    out = tmp_path / "语料 输出"
    tok = _run([str(REPO / "data_prep" / "train_tokenizer.py"), "--kind", "zh", "--input", str(zh_corpus),
                "--output", str(out / "分词器"), "--vocab-size", "2900", "--limit-bytes", "200K", "--quiet"], tmp_path)
    assert tok.returncode == 0, tok.stderr.decode("utf-8", "replace")[-3000:]
    text = out / "诗.txt"
    text.write_bytes(zh_corpus.read_bytes()[:60_000].rsplit(b"\n", 1)[0] + b"\n")
    prep = _run([str(REPO / "data_prep" / "build_indexed.py"), "--input", str(text), "--tokenizer",
                 str(out / "分词器"), "--output-prefix", str(out / "数据" / "zh"), "--workers", "1"], tmp_path)
    assert prep.returncode == 0, prep.stderr.decode("utf-8", "replace")[-3000:]
    assert (out / "数据" / "zh.manifest.json").is_file()


def test_the_switch_is_off_in_utf8_mode_and_under_a_utf8_locale(monkeypatch):
    from data_prep import utf8_mode

    monkeypatch.setattr(utf8_mode.locale, "getpreferredencoding", lambda do_setlocale=True: "UTF-8")
    assert not utf8_mode.needs_utf8_mode()
    monkeypatch.setattr(utf8_mode.locale, "getpreferredencoding", lambda do_setlocale=True: "GB18030")
    assert utf8_mode.needs_utf8_mode() == (not sys.flags.utf8_mode)


@pytest.mark.skipif(not _has_locale(GB18030), reason=f"the {GB18030} locale is not installed (locale-gen)")
def test_the_restart_keeps_the_pid_the_arguments_and_the_environment(tmp_path):
    """torchrun, srun and mpirun track their ranks by pid: the re-exec (os.execv) keeps it, with the command line
    and the environment (a launcher's RANK here), and sets PYTHONUTF8=1 for the children."""
    code = ("import os, sys; print('before', os.getpid(), file=sys.stderr, flush=True); "
            "from data_prep.utf8_mode import reexec_in_utf8_mode; reexec_in_utf8_mode(); "
            "print(os.getpid(), sys.flags.utf8_mode, os.environ['RANK'], os.environ['PYTHONUTF8'], sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONUTF8", "BERTFAMILY_UTF8"))}
    proc = subprocess.run([sys.executable, "-c", code, "a b", "语"], cwd=REPO, capture_output=True, timeout=120,
                          env=dict(env, LC_ALL=GB18030, RANK="3"))
    assert proc.returncode == 0, proc.stderr
    before = proc.stderr.decode().split()[1]
    assert proc.stdout.decode("utf-8").split(None, 4) == [before, "1", "3", "1", "['a b', '语']\n"]


@pytest.mark.parametrize("entry", ["data_prep/build_indexed.py", "data_prep/train_tokenizer.py",
                                   "data_prep/inspect_indexed.py", "data_prep/annotate.py", "trainer/pretrain.py",
                                   "trainer/finetune/__main__.py", "trainer/finetune/downstream.py",
                                   "trainer/data/build_index.py", "trainer/export_hf.py", "trainer/build_ops.py"])
def test_every_entry_point_switches_before_main(entry):
    main_block = (REPO / entry).read_text().rsplit('if __name__ == "__main__":', 1)[1]
    assert main_block.index("reexec_in_utf8_mode()") < main_block.index("main()")


def test_the_slurm_jobs_run_in_utf8_mode():
    """bf_setup_env (every template and build_indexed.sh) exports PYTHONUTF8=1: no restart on the nodes."""
    proc = subprocess.run(["bash", "-c", f"source {REPO}/slurm/common.sh; bf_setup_env; echo $PYTHONUTF8"], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SLURM_JOB_ID="1", BERTFAMILY_HOME=str(REPO), BERTFAMILY_VENV="none"))
    assert proc.stdout.split()[-1:] == ["1"], proc.stderr
