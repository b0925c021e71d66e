"""The shape of the code: no import cycles in trainer/ and data_prep/ (module-level and function-level imports alike),
and config validation (``--check``) that imports neither torch nor DeepSpeed nor the encoder."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "data_prep")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``name`` imports anywhere in its file: at module level, inside functions, in
    ``TYPE_CHECKING`` blocks. ``from a.b import c`` counts as an import of ``a.b.c`` when that is a module, else of
    ``a.b``; a parent package imported implicitly is not counted (so ``pkg/__init__.py`` may import its submodules)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . / from .x
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_function_level_imports_count(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from trainer import engine\n    from . import checkpoint\n")
    assert imports_of("trainer.loop", src, {"trainer", "trainer.engine", "trainer.checkpoint"}) == \
        {"trainer.engine", "trainer.checkpoint"}


def test_no_import_cycles_in_trainer_and_data_prep():
    graph = import_graph()
    assert "trainer.config" in graph and "data_prep.sidecar" in graph and len(graph) > 50
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


_BLOCK_TORCH = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "deepspeed", "numpy", "megatron", "transformers"):
            raise ImportError(f"{name} is made unimportable by this test")

sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("recipe", ["bert_base", "roberta_large", "albert_base", "electra_small"])
def test_check_validates_a_recipe_without_torch(recipe):
    """A login node without torch can validate: ``--check`` with torch, deepspeed and numpy unimportable."""
    code = _BLOCK_TORCH + "from trainer.pretrain import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "--config", recipe, "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f'"recipe": "{recipe}"' in proc.stdout


def test_config_loading_imports_no_torch_and_still_refuses_bad_input(tmp_path):
    """Every recipe that needs no prepared data validates without importing torch, DeepSpeed or the encoder; the
    checks that read objective options and the DeepSpeed JSON still run (ERNIE 2.0's unknown task, LAMB offload)."""
    code = """
import sys
from trainer.config import ConfigError, RECIPES_DIR, load_config
done = []
for path in sorted(RECIPES_DIR.glob("*.yaml")):
    try:
        load_config(path.stem)
        done.append(path.stem)
    except ConfigError as err:
        assert "auto" in str(err) and "manifest" in str(err), (path.stem, err)  # needs a prepared corpus
try:
    load_config("bert_base", ["optim.name=lamb", "deepspeed.config=ds_configs/zero2_offload.json"])
    raise SystemExit("LAMB under offload was accepted")
except ConfigError as err:
    assert "offloads the optimizer" in str(err), err
tasks = '[{name: mlm, iterations: 2, level: token}, {name: nosuch, iterations: 2, level: sentence}]'
try:
    load_config("ernie2_base", ["model.vocab_size=100", "model.pad_token_id=0",
                                f"objective.options.continual.tasks={tasks}"])
    raise SystemExit("an unknown ERNIE 2.0 task was accepted")
except ConfigError as err:
    assert "unknown task(s) ['nosuch']" in str(err), err
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "numpy", "megatron")
               or m in ("trainer.models.encoder", "trainer.models.heads", "trainer.engine"))
print(len(done), heavy)
"""
    # run from an empty folder: the recipes' corpus prefixes are relative, and in a checkout where `make quickstart`
    # ran (quickstart_out/), the tiny recipes' `auto` fields would resolve through the tokenizer (numpy, by design)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    count, heavy = proc.stdout.split(" ", 1)
    assert int(count) >= 10 and heavy.strip() == "[]", proc.stdout
