"""Where the judge lives and how to talk to it, read the way lmms-eval reads it.

lmms-eval's judges are configured by environment variables (OPENAI_API_KEY, OPENAI_API_URL,
API_TYPE, MODEL_VERSION, and AZURE_* for Azure); the openai client itself reads OPENAI_BASE_URL.
`JudgeConfig.from_env` accepts all of them so one shell setup serves both, and every field can be
overridden per call. The API key is deliberately NOT a field: it is read from the environment at
the moment a client is built (`api_key_from_env`), so it never sits in a config that gets printed,
logged or written into a report.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

API_TYPES = ("openai", "azure")
# Best first; see client.py. json_object_schema is json_object plus a "schema" key, the form
# llama-cpp-python's server constrains its grammar with (it rejects json_schema).
FORMAT_MODES = ("json_schema", "json_object_schema", "json_object", "text")
RESPONSE_FORMATS = ("auto",) + FORMAT_MODES
DEFAULT_MODEL = "gpt-4o-2024-11-20"  # lmms-eval's default MODEL_VERSION for its video judges
DEFAULT_AZURE_API_VERSION = "2024-02-15-preview"  # lmms-eval's default

# First variable set wins. OPENAI_BASE_URL is the openai client's, OPENAI_API_URL lmms-eval's
# (a base URL in lmms_eval/llm_judge, a full .../chat/completions URL in older video tasks).
BASE_URL_VARS = ("OPENAI_BASE_URL", "OPENAI_API_URL", "OPENAI_API_BASE")
AZURE_ENDPOINT_VARS = ("AZURE_ENDPOINT", "AZURE_OPENAI_ENDPOINT")
AZURE_VERSION_VARS = ("AZURE_API_VERSION", "API_VERSION", "AZURE_OPENAI_API_VERSION", "OPENAI_API_VERSION")
KEY_VARS = {"openai": ("OPENAI_API_KEY",), "azure": ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY", "OPENAI_API_KEY")}
_URL_SUFFIXES = ("/chat/completions", "/completions")


@dataclass(frozen=True)
class JudgeConfig:
    """Connection and decoding settings of an LLM judge (no secrets: see the module docstring)."""

    api_type: str = "openai"
    model: str = DEFAULT_MODEL
    base_url: str | None = None  # None: the openai client's default endpoint
    azure_endpoint: str | None = None
    api_version: str = DEFAULT_AZURE_API_VERSION
    response_format: str = "auto"  # "auto" negotiates, best first: see FORMAT_MODES
    timeout_s: float = 120.0
    max_retries: int = 2  # the openai client's own retries (connection errors, 408/409/429/5xx)
    max_connection_failures: int = 3  # consecutive failed requests (after those retries): the judge is gone
    parse_retries: int = 2  # re-asks when a reply does not parse or validate
    max_concurrency: int = 4
    max_tokens: int = 256
    seed: int = 1234
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.api_type not in API_TYPES:
            raise ValueError(f"api_type={self.api_type!r}; allowed: {', '.join(API_TYPES)}")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format={self.response_format!r}; allowed: {', '.join(RESPONSE_FORMATS)}")
        if not self.model:
            raise ValueError("model is empty; set MODEL_VERSION or pass model=")
        for name in ("max_retries", "parse_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}; must be >= 0")
        for name in ("max_concurrency", "max_tokens", "max_connection_failures"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; must be >= 1")
        if self.api_type == "azure" and not self.azure_endpoint:
            raise ValueError("api_type='azure' needs an endpoint: set AZURE_ENDPOINT or pass azure_endpoint=")
        if self.base_url is not None:
            object.__setattr__(self, "base_url", normalize_base_url(self.base_url))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> JudgeConfig:
        """Settings from the environment (lmms-eval's variable names), then `overrides` on top.

        Overrides whose value is None are ignored, so CLI options that were not given fall back
        to the environment.
        """
        env = os.environ if env is None else env
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown judge setting(s) {unknown}; allowed: {sorted(known)}")
        found: dict[str, object] = {
            "api_type": env.get("API_TYPE", "openai").strip().lower() or "openai",
            "model": env.get("MODEL_VERSION") or DEFAULT_MODEL,
            "base_url": _first(env, BASE_URL_VARS),
            "azure_endpoint": _first(env, AZURE_ENDPOINT_VARS),
            "api_version": _first(env, AZURE_VERSION_VARS) or DEFAULT_AZURE_API_VERSION,
        }
        found.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**found)  # type: ignore[arg-type]

    def with_overrides(self, **overrides: object) -> JudgeConfig:
        """A copy with the non-None overrides applied (validated again)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def describe(self) -> dict:
        """What a report should record about the judge: everything here, and never a key."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def normalize_base_url(url: str) -> str:
    """Accept a base URL or a full .../chat/completions URL (lmms-eval's older tasks) alike."""
    url = url.strip().rstrip("/")
    for suffix in _URL_SUFFIXES:
        if url.endswith(suffix):
            url = url[: -len(suffix)].rstrip("/")
            break
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url={url!r}; expected an http:// or https:// URL")
    return url


def api_key_from_env(api_type: str, env: Mapping[str, str] | None = None) -> str | None:
    """The API key for `api_type` from the environment, or None. Only client.py should call this."""
    if api_type not in KEY_VARS:
        raise ValueError(f"api_type={api_type!r}; allowed: {', '.join(API_TYPES)}")
    return _first(os.environ if env is None else env, KEY_VARS[api_type])


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return None
