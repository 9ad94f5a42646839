"""Every environment variable the settings or the Makefile read is documented in the README.

CELERY_BROKER_DIR and DJANGO_DB_NAME were read by settings.py and named nowhere in the README."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Set by pytest itself (settings read it to tell a test run), not by whoever deploys.
NOT_SETTINGS = {"PYTEST_VERSION"}


def _read_name(node: ast.AST) -> str | None:
    """The variable `node` reads from the environment, if it does: env_int("NAME", ...) and the
    other readers of config.env, os.environ.get("NAME"), os.environ["NAME"], "NAME" in os.environ."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        called = ast.unparse(node.func)
        if called.startswith("env_") or called in ("os.environ.get", "os.getenv"):
            return str(node.args[0].value)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
        return str(ast.literal_eval(node.slice))
    if isinstance(node, ast.Compare) and [ast.unparse(c) for c in node.comparators] == ["os.environ"]:
        return str(ast.literal_eval(node.left))
    return None


def _settings_variables() -> set[str]:
    """Names read from the environment by platform/config/settings*.py."""
    names = set()
    for path in sorted((ROOT / "platform" / "config").glob("settings*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _read_name(node)
            if name is not None:
                names.add(name)
    return names - NOT_SETTINGS


def _makefile_variables() -> set[str]:
    """Variables the Makefile takes from the environment: those set with ?= and those used but
    never set."""
    text = (ROOT / "Makefile").read_text()
    assigned = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*([?:]?=)", text, re.MULTILINE))
    used = set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", text))
    return {name for name, how in assigned.items() if how == "?="} | (used - set(assigned))


def _documented() -> set[str]:
    """Names that appear in a code span of the README (`NAME`, `make test NAME=...`)."""
    spans = re.findall(r"`([^`\n]+)`", (ROOT / "README.md").read_text())
    return {word for span in spans for word in re.findall(r"[A-Z][A-Z0-9_]+", span)}


def test_the_readme_documents_every_environment_variable_of_the_settings_and_the_makefile() -> None:
    read = _settings_variables()
    assert {"DATABASE_URL", "CELERY_BROKER_DIR", "DJANGO_DB_NAME"} <= read  # the scan finds them
    assert {"PYTHON", "VENV", "PYTEST_ARGS"} <= _makefile_variables()
    undocumented = (read | _makefile_variables()) - _documented()
    assert not undocumented, f"README.md does not mention {sorted(undocumented)}"
