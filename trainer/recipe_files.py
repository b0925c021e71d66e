"""Recipe files: a name or path -> YAML (with ``base:`` inheritance) as a dict. Apart from trainer/config.py so that
the config checks (trainer/config_checks.py), which read a shipped recipe's own values, import no module that
imports them (the suite refuses import cycles: tests/test_structure.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

from trainer.config_error import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe name (``tiny_roberta``), a YAML path, or a run's resolved ``config.json`` (JSON is YAML)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") and path.exists():  # a run's resolved config.json is YAML too
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise ConfigError(f"config {name_or_path!r}: no such file and no recipe of that name (recipes: {known})")


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """Read a YAML config; ``base: other_recipe`` inherits from another recipe (deep-merged, this file wins)."""
    if path in seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    return deep_merge(_read_yaml(resolve_recipe(base), seen + (path,)), raw)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def inherited_values(path: Path) -> dict | None:
    """What the config file ``path`` inherits through its ``base:`` chain (merged), without its own values: None
    when it names no base (a run's config.json, a file written whole)."""
    try:
        own = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None  # _read_yaml has said what is wrong with it already
    base = own.get("base") if isinstance(own, dict) else None
    return _read_yaml(resolve_recipe(base)) if isinstance(base, str) else None
