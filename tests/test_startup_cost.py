"""What a rank pays before its first step, besides the model: DeepSpeed's Muon module imported without compiling
(trainer/engine.py ``_import_muon_uncompiled``) and DeepSpeed's just-in-time ops built ahead of time
(trainer/build_ops.py)."""
import os
import subprocess
import sys
from pathlib import Path

from test_known_noise import _python as _run_python

REPO = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    return _run_python(code).stdout


def test_deepspeeds_muon_check_no_longer_imports_inductor():
    """DeepSpeed's ZeRO support check (run by every ``deepspeed.initialize``) imports its Muon module, which wraps
    kernels in ``torch.compile`` at import and so imports torch._inductor (1.5-3.5 s per rank). After the product's
    engine module is imported, the same check finds DeepSpeed's real Muon class (its ``isinstance`` checks work as
    before), torch._inductor stays unimported, and ``torch.compile`` is torch's own again. The control line shows
    the check imports inductor without the product's step, so the test can fail."""
    # the import DeepSpeed's check makes (deepspeed/runtime/zero/utils.py, is_zero_supported_optimizer; calling the
    # check itself needs a process group)
    check = "from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam; import torch, sys; "
    bare = _python("from data_prep.known_noise import choose_cpu_accelerator; choose_cpu_accelerator(); "
                   "import deepspeed; " + check + "print('torch._inductor' in sys.modules)")
    assert bare.split()[-1] == "True"
    out = _python("import trainer.engine; " + check +
                  "from deepspeed.runtime.zero.muon import muon_optimizer as m; from deepspeed.runtime.zero.muon "
                  "import original_muon as o; print('torch._inductor' in sys.modules, "
                  "m.MuonWithAuxAdam.__module__, issubclass(m.MuonWithAuxAdam, o.MuonWithAuxAdam), "
                  "torch.compile.__module__)")
    # the last line: with a CUDA build of torch and no GPU, DeepSpeed's accelerator warning comes first on stdout
    assert out.splitlines()[-1].split() == ["False", "deepspeed.runtime.zero.muon.muon_optimizer", "True", "torch"]


def test_build_ops_leaves_every_op_the_trainer_loads_ready():
    """``python -m trainer.build_ops`` (run by ``make venv``) reports each DeepSpeed JIT op this accelerator uses as
    ready, and a second run loads them without compiling (no library rewritten). On a machine where the ops were
    already built this is seconds; the first time, it is the build itself."""
    from trainer.build_ops import OPS

    out = subprocess.run([sys.executable, "-m", "trainer.build_ops", "--strict"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if ": " in l and not l.startswith("[")]
    assert len(lines) == len(OPS), out.stdout
    ready = [l for l in lines if ": ready (" in l]
    import torch
    if torch.version.cuda is None:  # the CPU accelerator uses both
        assert {l.split(":")[0] for l in ready} == {"cpu_adam", "deepspeed_shm_comm"}, out.stdout
    # built now: a second run loads them without compiling (ninja finds nothing to do: no library is rewritten)
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.so")}
    assert {p.stem for p in before} >= {l.split(":")[0] for l in ready}, (root, sorted(before))
    again = subprocess.run([sys.executable, "-m", "trainer.build_ops"], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.so")} == before
