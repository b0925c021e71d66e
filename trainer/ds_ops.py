"""DeepSpeed's just-in-time ops at start-up: their torch build locks checked (``trainer/ext_lock.py``) and, where the
extensions folder is not writable by this user, a built op loaded from its library directly. Apart from
``trainer/engine.py`` (which calls ``clear_stale_op_locks`` before DeepSpeed loads an op) to keep that module's size
down."""
from __future__ import annotations

import os
import sys

from deepspeed.accelerator import get_accelerator


def clear_stale_op_locks(builder_names, should_stop=None) -> None:
    """Before DeepSpeed JIT-loads these ops: their stale torch build locks removed, live ones waited on
    (``trainer/ext_lock.py``): a lock left by a killed build or load otherwise hangs the start silently. An op built
    in a folder this process cannot write (a read-only image, another user's build) is loaded here from its library,
    without torch's lock and ninja run, which would fail there (``_load_readonly_build``)."""
    from trainer.ext_lock import build_dir, clear_stale_locks, writable
    for name in builder_names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            continue
        folder = build_dir(builder.name)
        if writable(folder):
            clear_stale_locks([builder.name], should_stop=should_stop, folder_of=lambda _op, f=folder: f)
        else:
            _load_readonly_build(builder, folder)


def _load_readonly_build(builder, folder) -> None:
    """Load ``builder``'s op from ``folder`` (not writable here) as torch's loader does (``spec_from_file_location``
    of the library), and put it where DeepSpeed's ``OpBuilder.load`` looks first (its ``_loaded_ops``, shared by every
    builder of that class tree), so that DeepSpeed's own load returns it and never reaches torch's lock."""
    import importlib.util

    from trainer.ext_lock import readonly_build
    if builder.name in builder._loaded_ops:
        return
    sources = [os.path.abspath(builder.deepspeed_src_path(p)) for p in builder.sources()]  # as jit_load passes them
    library = readonly_build(folder, builder.name, sources, builder.strip_empty_entries(builder.cxx_args()))
    spec = importlib.util.spec_from_file_location(library.stem, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder._loaded_ops[builder.name] = module
    print(f"note: {folder} is not writable by this user: loaded the built {builder.name} op from {library.name} "
          "directly (torch would take its build lock there)", file=sys.stderr, flush=True)
