"""Loading checkpoints without running code from them (issue 21, item 5).

A ``.pt`` file is a pickle, and unpickling can call any function the file names: a checkpoint received from another
team, or altered on a shared filesystem, could run code on every node that resumes from it, initialises from it,
exports it or fine-tunes it. torch's weights-only unpickler rebuilds tensors and plain data (dicts, lists, numbers,
strings) and refuses every other global unless it is allow-listed. Every checkpoint load of this trainer goes through
it:

- our own files (``rng_rank*.pt``, the ``init_from`` cache) through ``load``;
- DeepSpeed's loads (its ``TorchCheckpointEngine.load``, ``zero_to_fp32``, ``ds_to_universal``), which pass
  ``weights_only=False`` themselves, inside ``weights_only_loads``: torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read at
  every ``torch.load`` call, overrides that argument (torch/serialization.py), and ``torch.serialization.safe_globals``
  allows the few DeepSpeed classes its checkpoints hold (``trainer.engine.checkpoint_globals``, found by saving at
  ZeRO 0-3: tests/test_untrusted_checkpoints.py checks the list against real saves);
- ``python -m trainer.safe_run MODULE ARGS...`` (``trainer/safe_run.py``) runs a DeepSpeed tool (the universal
  converter) the same way in a child process.

A refused load raises ``UntrustedCheckpointError`` naming the file and what it would have called. The scan that
names it (``refused_files``) reads only each file's pickle opcodes (``get_unsafe_globals_in_checkpoint``), and only
after a refusal, so a normal load costs nothing extra.
"""
from __future__ import annotations

import os
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


class UntrustedCheckpointError(RuntimeError):
    """A checkpoint file would run code (or build objects outside the allow-list) when loaded."""


def numpy_rng_globals() -> list[Callable]:
    """What an ``rng_rank*.pt`` written before the plain-data format holds: numpy's MT19937 key array
    (``numpy.random.get_state()``). Rebuilding an array calls only these; they run no code of the file's choosing."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover  (numpy 1.x)
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]  # the last: numpy.dtypes.UInt32DType


def _global_name(obj) -> str:
    """The name a pickle's GLOBAL opcode gives ``obj`` (what ``get_unsafe_globals_in_checkpoint`` reports)."""
    if isinstance(obj, tuple):  # (obj, "module.name") as torch.serialization.add_safe_globals accepts
        return obj[1]
    return f"{obj.__module__}.{obj.__qualname__}"


def _names(allowed: Iterable) -> set[str]:
    names = {_global_name(g) for g in allowed}
    # numpy 2 pickles its private module as numpy._core; older writers said numpy.core
    return names | {n.replace("numpy._core.", "numpy.core.") for n in names}


def refusal(path: Path, unsafe: list[str], err: BaseException | None = None) -> str:
    detail = str(err).split("WeightsUnpickler error:")[-1].strip().split("\n\n")[0] if err else ""
    what = (f"unpickling it would call {', '.join(unsafe)}" if unsafe
            else f"it holds more than tensors and plain data ({detail or 'unreadable'})")
    return (f"{path}: refused to load: {what}. Checkpoints are loaded as tensors and plain data only (plus the few "
            "DeepSpeed state classes this trainer allows), so that loading one cannot run code on this machine; this "
            "file was not written by this trainer and DeepSpeed, or was altered since. Get the checkpoint again from "
            "a source you trust; nothing was loaded from it.")


def unsafe_globals(path: Path, allowed: Iterable = ()) -> list[str]:
    """The globals ``path``'s pickle names that neither torch's weights-only defaults nor ``allowed`` permit. Reads
    the opcodes only (nothing is called)."""
    ok = _names(allowed)
    return [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) if g not in ok]


def refused_files(folders: Iterable[Path], allowed: Iterable = ()) -> list[tuple[Path, list[str]]]:
    """Files under ``folders`` (``*.pt``, recursively) that a weights-only load with ``allowed`` refuses, with the
    globals each names. A file whose opcodes look clean but still fails (a legacy non-zip pickle, a blocked opcode)
    is tried with a weights-only load, which runs nothing either."""
    allowed = list(allowed)
    found = []
    for folder in folders:
        folder = Path(folder)
        files = [folder] if folder.is_file() else sorted(folder.rglob("*.pt"))
        for f in files:
            try:
                bad = unsafe_globals(f, allowed)
            except Exception:  # noqa: BLE001  (not a zip checkpoint: the load below says what it is)
                bad = []
            if bad:
                found.append((f, bad))
                continue
            try:
                with torch.serialization.safe_globals(allowed):
                    torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except pickle.UnpicklingError:
                found.append((f, []))
            except Exception:  # noqa: BLE001  (mmap needs the zip format; the refusal, if any, is the pickle's)
                try:
                    with torch.serialization.safe_globals(allowed):
                        torch.load(f, map_location="cpu", weights_only=True)
                except pickle.UnpicklingError:
                    found.append((f, []))
                except Exception:  # noqa: BLE001  (truncated or not a checkpoint: not a refusal)
                    pass
    return found


def vet(folders: Iterable[Path], allowed: Iterable = ()) -> None:
    """Refuse a checkpoint any of whose ``*.pt`` files names a global outside torch's weights-only defaults and
    ``allowed``, before loading any of it. Reads each file's pickle opcodes only (its tensors are not read), so it
    also covers files the caller would not load (an export does not read ``rng_rank*.pt``): a checkpoint holding one
    poisoned file is not trusted as a whole."""
    allowed = list(allowed)
    bad = []
    for folder in folders:
        folder = Path(folder)
        for f in ([folder] if folder.is_file() else sorted(folder.rglob("*.pt"))):
            try:
                names = unsafe_globals(f, allowed)
            except Exception:  # noqa: BLE001  (not a zip checkpoint: the forced weights-only load decides)
                continue
            if names:
                bad.append((f, names))
    if bad:
        raise UntrustedCheckpointError("\n".join(refusal(f, g) for f, g in bad))


def load(path: str | Path, allowed: Iterable = (), map_location="cpu"):
    """``torch.load(path, weights_only=True)`` with ``allowed`` globals; a refusal names the file."""
    allowed = list(allowed)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        bad = []
        try:
            bad = unsafe_globals(Path(path), allowed)
        except Exception:  # noqa: BLE001  (the refusal stands; only its detail is missing)
            pass
        raise UntrustedCheckpointError(refusal(Path(path), bad, err)) from None


@contextmanager
def weights_only_loads(folders: Iterable[Path], allowed: Iterable = ()) -> Iterator[None]:
    """Every ``torch.load`` inside (DeepSpeed's too, whatever ``weights_only`` it passes) is weights-only with
    ``allowed`` globals. A refusal inside raises ``UntrustedCheckpointError`` naming the refused file(s) found under
    ``folders`` (the checkpoint being loaded). Process-wide while it lasts (an environment variable and torch's
    allow-list): use it around a load, not around training."""
    allowed = list(allowed)
    folders = [Path(f) for f in folders]
    before = os.environ.get(FORCE)
    os.environ[FORCE] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    except pickle.UnpicklingError as err:
        bad = refused_files(folders, allowed)
        if not bad:
            raise UntrustedCheckpointError(f"loading {', '.join(map(str, folders))} was refused by torch's "
                                           f"weights-only unpickler: {err}") from None
        raise UntrustedCheckpointError("\n".join(refusal(f, g, err) for f, g in bad)) from None
    finally:
        if before is None:
            os.environ.pop(FORCE, None)
        else:
            os.environ[FORCE] = before
