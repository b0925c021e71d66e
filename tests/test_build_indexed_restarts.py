"""build_indexed.py stopped and run again: a restart after SIGKILL is byte-identical, an unfinished run with other
settings is not mixed in, an aborted other command leaves the finished corpus usable, pool workers die with a killed
parent and the run resumes. The rest of build_indexed end to end is in tests/test_build_indexed.py."""
import json
import os
import re
import sys
from pathlib import Path

import pytest

import fork_server
from data_prep import build_indexed
from data_prep import manifest as mf
from test_build_indexed import (REPO, build, en_slice, en_tokenizer, output_files,  # noqa: F401 (fixtures)
                                small_text)


def run_cli(*args, env=None, cwd=REPO):
    return fork_server.run([sys.executable, "data_prep/build_indexed.py", *map(str, args)], cwd=cwd,
                           env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.slow
def test_restart_after_kill_is_byte_identical(en_slice, en_tokenizer, tmp_path):
    common = ["--input", en_slice, "--tokenizer", en_tokenizer, "--split-sentences", "--chunk-size-mb", "0.06",
              "--shard-size-mb", "0.05"]
    ref = tmp_path / "ref" / "c"
    assert build([en_slice], en_tokenizer, ref, *map(str, common[4:])) == 0
    prefix = tmp_path / "run" / "c"
    # 1) the whole process is SIGKILLed after finishing 3 pieces (one process, no pool)
    killed = run_cli(*common, "--output-prefix", prefix, env={build_indexed.KILL_HOOK: "3"})
    assert killed.returncode == -9, killed.stderr
    assert not mf.manifest_path(prefix).exists()
    assert not list(prefix.parent.glob("c_0*"))  # no final shard name holds anything yet
    assert len(list(Path(f"{prefix}.work").glob("piece_*.json"))) == 3
    # 2) a pool worker dies: the run stops with a clear error (no hang), finished pieces kept
    broken = run_cli(*common, "--output-prefix", prefix, "--workers", "2", env={build_indexed.KILL_HOOK: "1"})
    assert broken.returncode == 2 and "worker process died" in broken.stderr, broken.stderr
    assert re.search(r"restart: 3 of \d+ pieces already finished", broken.stdout), broken.stdout
    # corrupt one finished shard in the work folder: the restart must notice and redo that piece
    some = sorted(Path(f"{prefix}.work").glob("piece_*-000.bin"))[0]
    some.write_bytes(b"garbage")
    # finish with Rust threads on (the reference ran with TOKENIZERS_PARALLELISM=false): ids must not depend on it
    done = run_cli(*common, "--output-prefix", prefix, "--workers", "2", "--tokenizer-threads", "2",
                   env={"TOKENIZERS_PARALLELISM": "true"})
    assert done.returncode == 0, done.stderr
    assert "pieces already finished and verified" in done.stdout
    assert output_files(prefix) == output_files(ref)
    # 3) rerunning a finished command does nothing and changes nothing
    before = {p: p.stat().st_mtime_ns for p in prefix.parent.iterdir()}
    again = run_cli(*common, "--output-prefix", prefix)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert before == {p: p.stat().st_mtime_ns for p in prefix.parent.iterdir()}


def test_unfinished_run_with_other_settings_is_not_mixed_in(en_slice, en_tokenizer, tmp_path):
    prefix = tmp_path / "c"
    workdir = Path(f"{prefix}.work")
    workdir.mkdir()
    # what an unfinished run of another command leaves: its plan, a finished piece of its own
    (workdir / "plan.json").write_text(json.dumps({"settings": {"split_sentences": False}, "pieces": []}))
    (workdir / "piece_000000.json").write_text(json.dumps({"piece": {}, "shards": [], "skipped": {}}))
    with pytest.raises(SystemExit, match="unfinished run with other .*settings.*--overwrite"):
        build([en_slice], en_tokenizer, prefix, "--chunk-size-mb", "0.2", "--split-sentences")
    assert not mf.manifest_path(prefix).exists()
    assert build([en_slice], en_tokenizer, prefix, "--chunk-size-mb", "0.2", "--split-sentences",
                 "--overwrite") == 0
    assert mf.read_manifest(prefix)["settings"]["split_sentences"] is True
    assert not workdir.exists()


def test_an_aborted_other_command_leaves_the_finished_corpus_usable(en_tokenizer, tmp_path, monkeypatch, capsys):
    """Reviewer bug 2: another command on the same prefix, aborted after 2 pieces, deleted the finished corpus's
    manifest at its start (the shards were intact), and the original command was then refused ("unfinished run with
    other ..."). Now the corpus stays as it was until the new run's finalize replaces it, the original command is up
    to date, and the other command, rerun, finishes and replaces it."""
    src = small_text(tmp_path / "a.txt", docs=400)
    prefix = tmp_path / "out" / "c"
    common = ("--chunk-size-mb", "0.004")
    assert build([src], en_tokenizer, prefix, *common) == 0
    finished = output_files(prefix)
    assert len(finished) > 6

    calls = []

    def aborts_after_two(piece):  # a Ctrl-C after two finished pieces of the other command
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(piece)
        return real(piece)

    real = build_indexed._build_in_worker
    monkeypatch.setattr(build_indexed, "_build_in_worker", aborts_after_two)
    assert build([src], en_tokenizer, prefix, *common, "--split-sentences") == 2
    monkeypatch.setattr(build_indexed, "_build_in_worker", real)
    assert len(list(Path(f"{prefix}.work").glob("piece_*.json"))) == 2
    assert output_files(prefix) == finished
    capsys.readouterr()
    assert build([src], en_tokenizer, prefix, *common) == 0
    out = capsys.readouterr().out
    assert "up to date" in out and "unfinished run of another command" in out
    assert Path(f"{prefix}.work").exists()  # left for its own command
    # a third command is still refused: its pieces must not be mixed with the second's
    with pytest.raises(SystemExit, match="unfinished run with other .*settings"):
        build([src], en_tokenizer, prefix, "--chunk-size-mb", "0.005")
    # the other command, rerun, resumes and replaces the corpus
    assert build([src], en_tokenizer, prefix, *common, "--split-sentences") == 0
    assert "restart: 2 of" in capsys.readouterr().out
    assert mf.read_manifest(prefix)["settings"]["split_sentences"] is True
    assert not Path(f"{prefix}.work").exists()


def test_pool_workers_exit_when_the_parent_is_killed_and_the_run_resumes(en_tokenizer, tmp_path):
    """Reviewer bug 10: SIGTERM to build_indexed left its --workers processes orphaned forever (blocked on the pool's
    pipe). Now each worker asks the kernel to kill it with its parent (PR_SET_PDEATHSIG); the run, started again,
    ends byte-identical to an uninterrupted one. The parent is a fork of this test process whose workers (forked
    from it, so they inherit the patch) hang in their third piece, like workers busy with a long piece."""
    import signal
    import time

    import psutil

    src = small_text(tmp_path / "a.txt", docs=400)
    common = ("--chunk-size-mb", "0.004", "--workers", "2")
    ref, prefix = tmp_path / "ref" / "c", tmp_path / "run" / "c"
    assert build([src], en_tokenizer, ref, *common) == 0
    hanging = tmp_path / "hanging"
    hanging.mkdir()
    pid = os.fork()
    if pid == 0:  # the build_indexed process to be killed
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            real = build_indexed._Worker.build

            def hang_from_the_third_piece(self, piece):
                if piece.index >= 2:
                    (hanging / str(os.getpid())).touch()
                    time.sleep(120)
                return real(self, piece)

            build_indexed._Worker.build = hang_from_the_third_piece
            build([src], en_tokenizer, prefix, *common)
        finally:
            os._exit(3)
    workers = []
    try:
        deadline = time.time() + 30
        while len(list(hanging.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.05)
        workers = psutil.Process(pid).children()
        assert len(workers) == 2 and len(list(hanging.iterdir())) == 2
        os.kill(pid, signal.SIGTERM)
        assert os.waitpid(pid, 0)[1] == signal.SIGTERM
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == [], "pool workers outlived their parent"
    finally:  # whatever failed above, leave no process behind
        for proc in [psutil.Process(pid), *workers] if psutil.pid_exists(pid) else workers:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped above
            pass
    assert len(list(Path(f"{prefix}.work").glob("piece_*.json"))) == 2
    assert build([src], en_tokenizer, prefix, *common) == 0
    assert output_files(prefix) == output_files(ref)
