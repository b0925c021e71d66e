"""``trainer/pretrain.py`` as torchrun's entry point, recording each rank's exit status in
``$EXIT_STATUS_DIR/rank{RANK}``: a torchrun stopped by a signal waits for its ranks and then fails with its own
SignalException traceback, so its exit status says nothing about theirs (tests/test_preemption.py).

    torchrun --nproc_per_node 2 tests/rank_exit.py --config CFG --set ...
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.pretrain import exit_process, main  # noqa: E402

if __name__ == "__main__":
    code = main()
    Path(os.environ["EXIT_STATUS_DIR"], f"rank{os.environ.get('RANK', '0')}").write_text(str(code))
    exit_process(code)
