"""``--set KEY=VALUE``: one override applied to a raw config dict (trainer/config.py re-exports it). The value is
read as YAML and typed later by the schema; a value YAML would cut at a comment, and an empty one, are refused."""
from __future__ import annotations

import json

import yaml

from trainer.config_error import ConfigError


def apply_override(raw: dict, override: str) -> None:
    """``optim.lr=4e-4`` sets raw['optim']['lr']; the value is parsed as YAML and typed later by the schema."""
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: expected KEY=VALUE, e.g. --set optim.lr=4e-4")
    key, value = override.split("=", 1)
    parts = key.strip().split(".")
    if not value.strip():
        # an empty value was read as null: a template whose value came from a failed command substitution (a job
        # script of another version than the common.sh it sources) set checkpoint.init_from to none, silently
        raise ConfigError(f"--set {override!r}: no value after '='; give one, or write {key}=null to unset the key")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {override!r}: the value is not valid YAML ({str(err).splitlines()[0]}); quote it: "
                          f"--set '{key}=\"...\"'") from None
    if "#" in value and "#" not in json.dumps(parsed, default=str, ensure_ascii=False):
        # " #..." starts a YAML comment: "run_dir=runs/exp #2" would train into runs/exp, another run's folder
        raise ConfigError(f"--set {override!r}: YAML reads ' #' and what follows as a comment, so the value would be "
                          f"{parsed!r}; quote the value as a YAML string: --set '{key}=\"{value.strip()}\"'")
    node = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):  # data.corpora.0.prefix: an index into a list
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {key}: {part!r} is not an index of the {len(node)}-item list before it")
            if last:
                node[int(part)] = parsed
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = parsed
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"--set {key}: {parts[i - 1]!r} is a value, not a section")
