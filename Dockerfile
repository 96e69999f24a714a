# The itlbench image: the bundled engine (`itlbench serve`) and the harness (`itlbench run`).
# CPU build of PyTorch by default; for the GPU profile docker-compose.yml passes
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# GCC builds the native CPU kernels at first use (-march=native: for the machine the container runs on,
# so they cannot be built into the image); without it the CPU engine runs its slow torch path.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/itlbench
RUN pip install --index-url "${TORCH_INDEX_URL}" torch
COPY pyproject.toml README.md ./
COPY itlbench ./itlbench
RUN pip install ".[otel,fast]"

WORKDIR /work
EXPOSE 8000 9464
CMD ["itlbench", "--help"]
