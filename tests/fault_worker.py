"""The stand-in trainer (tests/test_trainer_standin.py) with faults injected:

- ``BERTFAMILY_TEST_ENOSPC=SUBSTRING``: a full disk in torch.save: every write of a file whose path contains it writes
  part of the file, then raises OSError(ENOSPC), as a full filesystem does. DeepSpeed writes its shards through
  torch.save, so this reaches its writes too. What it cannot see: a real filesystem's behaviour (a short write(2),
  EDQUOT, NFS reporting the error only at close).
- ``BERTFAMILY_TEST_HEARTBEAT_FAILS_AFTER=N``: the run lock's heartbeat raises RuntimeError after N beats.
"""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import test_trainer_standin  # noqa: E402,F401  (registers the stand-in objective)

_real_save = torch.save


def _full_disk_save(obj, f, *args, **kwargs):
    target = os.environ.get("BERTFAMILY_TEST_ENOSPC")
    if target and isinstance(f, (str, os.PathLike)) and target in str(f):
        with open(f, "wb") as out:
            out.write(b"\0" * 1024)  # a partial file, as a write that ran out of space leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
    return _real_save(obj, f, *args, **kwargs)


torch.save = _full_disk_save

if os.environ.get("BERTFAMILY_TEST_HEARTBEAT_FAILS_AFTER"):
    from trainer.run_lock import RunLock

    _real_beat = RunLock._write_heartbeat

    def _failing_beat(self):
        if self._beats >= int(os.environ["BERTFAMILY_TEST_HEARTBEAT_FAILS_AFTER"]):
            raise RuntimeError("injected heartbeat failure")
        _real_beat(self)

    RunLock._write_heartbeat = _failing_beat

if __name__ == "__main__":
    from trainer.pretrain import exit_process, main  # ends as trainer/pretrain.py does (see exit_process)
    exit_process(main(sys.argv[1:]))
