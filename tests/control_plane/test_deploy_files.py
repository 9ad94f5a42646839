"""docker/compose.yaml wires the production-shaped deployment together (Docker does not run here;
the Dockerfiles are linted by hadolint in `make lint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_it_defines_the_six_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "web", "worker", "beat", "agent"}


def test_it_builds_the_control_plane_and_agent_from_existing_dockerfiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    expected = {
        "web": "control-plane.Dockerfile",
        "worker": "control-plane.Dockerfile",
        "beat": "control-plane.Dockerfile",
        "agent": "agent.Dockerfile",
    }
    for name, dockerfile in expected.items():
        build = services[name]["build"]
        assert build["dockerfile"] == f"docker/{dockerfile}"
        context = (DOCKER / build["context"]).resolve()
        assert (context / build["dockerfile"]).is_file()
        assert (context / "requirements.txt").is_file()
    assert services["web"]["image"] == services["worker"]["image"] == services["beat"]["image"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["redis"]["image"].startswith("redis:")


def test_it_points_web_and_worker_at_postgres_and_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres_env = services["postgres"]["environment"]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        user, password, db = (
            postgres_env["POSTGRES_USER"],
            postgres_env["POSTGRES_PASSWORD"],
            postgres_env["POSTGRES_DB"],
        )
        assert env["DATABASE_URL"] == f"postgres://{user}:{password}@postgres:5432/{db}"
        assert env["REDIS_URL"].startswith("redis://redis:6379/")
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")  # required, never a default
        assert env["DEBUG"] == "false"
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["redis"]["condition"] == "service_healthy"
    assert "migrate" in " ".join(services["web"]["command"])
    for name in ("worker", "beat"):
        # Web migrates, then serves (and only then passes its health check): a worker or beat that
        # started with it ran tasks against tables that did not exist yet, or columns of the image
        # before (ProgrammingError: relation "jobs_job" does not exist).
        assert services[name]["depends_on"]["web"]["condition"] == "service_healthy", name
    assert services["worker"]["command"][:4] == ["celery", "-A", "config.celery", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "config.celery", "beat"]


def test_it_gives_the_agent_gpus_and_the_control_plane_url(compose: dict[str, Any]) -> None:
    agent = compose["services"]["agent"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    command = agent["command"]
    assert command[command.index("--control-plane") + 1] == "http://web:8000"
    assert "GPU_AGENT_TOKEN" in agent["environment"]
    assert agent["depends_on"]["web"]["condition"] == "service_healthy"


def test_it_installs_the_pinned_cuda_vllm_in_the_agent_image() -> None:
    dockerfile = (DOCKER / "agent.Dockerfile").read_text()
    assert "FROM nvidia/cuda:" in dockerfile
    assert "requirements-vllm-gpu.txt" in dockerfile
    pins = (DOCKER.parent / "requirements-vllm-gpu.txt").read_text().split()
    assert "vllm==0.32.0" in pins


def test_it_gives_the_agent_image_the_c_compiler_that_triton_builds_its_launcher_with() -> None:
    # triton.runtime.build._find_compiler: CC, else gcc or clang on PATH, else every engine fails
    # at its first kernel. nvidia/cuda's runtime images ship no compiler.
    text = (DOCKER / "agent.Dockerfile").read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if line.startswith("RUN ") and "apt-get install" in line]
    assert any(" gcc " in f"{line} " and "libc6-dev" in line for line in installs), installs


def test_the_agent_keeps_engine_logs_and_weights_on_volumes_its_user_can_write(
    compose: dict[str, Any],
) -> None:
    # Recreating the agent container (a new image) lost every engine log and downloaded weight.
    mounts = dict(m.split(":", 1) for m in compose["services"]["agent"]["volumes"])
    assert mounts == {"agent-state": "/app/var/agent", "model-cache": "/home/agent/.cache/huggingface"}
    assert set(mounts) <= set(compose["volumes"])
    # A new named volume takes the ownership of the image's folder; at a missing path it is root's,
    # and the agent (uid 10001) could not write its state or vLLM its downloads.
    text = (DOCKER / "agent.Dockerfile").read_text().replace("\\\n", " ")
    setup = next(line for line in text.splitlines() if "useradd" in line)
    for path in mounts.values():
        assert path in setup.split("mkdir -p", 1)[1].split("&&")[0], path
    owned = setup.split("chown -R 10001:10001", 1)[1].split()
    assert all(any(path.startswith(top) for top in owned) for path in mounts.values()), owned
    assert "--state-dir" not in compose["services"]["agent"]["command"]  # default var/agent in /app


def test_the_build_context_leaves_out_secrets_and_local_caches_but_not_what_images_copy() -> None:
    root = DOCKER.parent
    ignored = [
        line.strip()
        for line in (root / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in ("docker/.env", ".secret_key", ".venv", ".git", "**/__pycache__"):
        assert needed in ignored, needed
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        text = dockerfile.read_text()
        for line in text.splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert source.rstrip("/") not in ignored, (dockerfile.name, source)
                    assert (root / source).exists(), (dockerfile.name, source)
