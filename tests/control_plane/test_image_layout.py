"""The images in docker/ hold what their processes import (Docker does not run here).

Each test lays out a Dockerfile's image the way `docker build` would: only the paths its COPY lines
name, under its WORKDIR, with its PYTHONPATH; then imports every module its processes load from
there, in a fresh interpreter that sees nothing of the checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def dockerfile_lines(name: str) -> list[str]:
    """The instructions of docker/<name>, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", (DOCKER / name).read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def dockerfile_env(name: str) -> dict[str, str]:
    """The ENV of the Dockerfile's last stage (KEY=VALUE pairs)."""
    lines = dockerfile_lines(name)
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    env: dict[str, str] = {}
    for line in lines[last_from:]:
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def copied_paths(name: str) -> list[str]:
    """The build-context paths the Dockerfile's COPY lines take (not those from other stages)."""
    paths: list[str] = []
    for line in dockerfile_lines(name):
        if line.startswith("COPY ") and "--from=" not in line:
            *sources, _destination = shlex.split(line[5:])
            paths += [s.rstrip("/") for s in sources]
    return paths


def lay_out_image(name: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The image's /app as a folder under tmp_path, and the environment its processes get."""
    app = tmp_path / "app"
    app.mkdir()
    for rel in copied_paths(name):
        source = ROOT / rel
        assert source.exists(), f"{name}: COPY {rel}: no such path in the build context"
        if source.is_dir():
            shutil.copytree(source, app / rel, ignore=shutil.ignore_patterns("__pycache__", "tests"))
        else:
            shutil.copy2(source, app / rel)
    image_env = dockerfile_env(name)
    python_path = [p.replace("/app", str(app), 1) for p in image_env.get("PYTHONPATH", "").split(":") if p]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(python_path),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return app, env


# Every module under the trees named on the command line is imported (tests and migrations aside):
# the processes load them. With Django, the web server's and the worker's entry points first.
IMPORT_ALL = """
import importlib, os, pathlib, sys
if os.environ.get("DJANGO_SETTINGS_MODULE"):
    import django
    django.setup()
    import config.asgi
    from config.celery import app as celery_app
    celery_app.loader.import_default_modules()
for top in sys.argv[1:]:
    tree = pathlib.Path(top)
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree.parent if (tree / "__init__.py").exists() else tree).with_suffix("")
        if {"tests", "migrations"} & set(rel.parts) or rel.name == "__main__":
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts:
            importlib.import_module(".".join(parts))
print("imported")
"""


def import_all(app: Path, package: str, env: dict[str, str]) -> None:
    """Import every module under ``app/package`` in a fresh interpreter run in the laid-out image."""
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(app / package)],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("imported")


def test_it_lays_out_the_control_plane_image_with_everything_the_web_server_and_worker_import(
    tmp_path: Path,
) -> None:
    app, env = lay_out_image("control-plane.Dockerfile", tmp_path)
    image_env = dockerfile_env("control-plane.Dockerfile")
    env.update(
        DJANGO_SETTINGS_MODULE=image_env["DJANGO_SETTINGS_MODULE"],
        VAR_DIR=str(tmp_path / "var"),
        SECRET_KEY="image-layout-test-" + "x" * 40,
        DEBUG="false",
    )
    import_all(app, "platform", env)
    check = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=app, env=env, capture_output=True, text=True, timeout=300
    )
    assert check.returncode == 0, check.stderr[-3000:]


def test_it_lays_out_the_agent_image_with_everything_the_agent_imports(tmp_path: Path) -> None:
    app, env = lay_out_image("agent.Dockerfile", tmp_path)
    import_all(app, "gpu_agent", env)


@pytest.mark.parametrize("name", ["control-plane.Dockerfile", "agent.Dockerfile"])
def test_it_copies_only_paths_that_exist(name: str) -> None:
    for rel in copied_paths(name):
        assert (ROOT / rel).exists(), f"{name}: COPY {rel}"
