# GPU agent image for NVIDIA hosts: the agent daemon plus vLLM's CUDA build
# (requirements-vllm-gpu.txt, vllm==0.32.0). Run with the NVIDIA container toolkit (`gpus: all`).
# Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t llm-platform/agent .
FROM ghcr.io/astral-sh/uv:0.8.0 AS uv

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# uv installs a standalone CPython 3.11 into /opt/python and the venv into /opt/venv, so the CUDA
# image needs no distribution Python packages.
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH=/app

# Triton (vLLM's kernels, torch.compile) builds its CUDA launcher (triton/backends/nvidia/driver.c)
# with the system C compiler the first time an engine runs a kernel; the CUDA runtime image has
# none, so every engine would fail with "Failed to find C compiler". Not pinned: Ubuntu's updates
# replace the pinned versions, which would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

COPY requirements.txt requirements-vllm-gpu.txt ./
RUN uv venv --python 3.11 /opt/venv \
    && uv pip install --python /opt/venv/bin/python -r requirements.txt -r requirements-vllm-gpu.txt

COPY serving/ serving/
COPY gpu_agent/ gpu_agent/

# The state dir (engine logs, offload counters, the Aqua socket) and Hugging Face's cache (model
# weights) exist in the image, owned by the agent's user: a new named volume mounted there
# (docker/compose.yaml) takes that ownership, one created at a missing path would be root's.
RUN groupadd --system --gid 10001 agent \
    && useradd --system --uid 10001 --gid agent --create-home --home-dir /home/agent agent \
    && mkdir -p /app/var/agent /home/agent/.cache/huggingface \
    && chown -R 10001:10001 /app/var /home/agent/.cache
USER 10001:10001

# Control plane URL and token come from the environment (GPU_AGENT_TOKEN) or flags.
ENTRYPOINT ["python", "-m", "gpu_agent"]
CMD ["--help"]
