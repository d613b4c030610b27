"""The judge against a real OpenAI-compatible server: llama-cpp-python serving SmolLM2-135M-Instruct.

No recordings here: a real server process on 127.0.0.1, the real openai client, real replies.
Checks the plumbing, not judging quality (a 135M model is no judge): format negotiation (this
server answers json_schema with HTTP 500 and takes json_object with a schema), the cache (a second run sends
nothing, counted in the server's own access log), and that every score is 0-5 or missing.
Install the server with `bash scripts/judge_server.sh .venv`; without it these tests skip.
"""
from __future__ import annotations

import pytest

from judges import validate
from judges.cache import JudgeCache
from judges.client import CaptionItem, JudgeClient, score_captions
from judges.config import JudgeConfig
from judges.server import JudgeServer, missing_reason
from lvspec_eval.demo import world

pytestmark = pytest.mark.judge_server
MAX_RETRIES = 1  # the openai client retries the rejected json_schema request this many times


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = missing_reason()
    if reason:
        pytest.skip(f"local judge server not available: {reason}")
    log_path = tmp_path_factory.mktemp("judge_server") / "server.log"
    with JudgeServer.start(log_path=log_path, n_threads=1) as running:
        yield running


def _client(server: JudgeServer, cache: JudgeCache) -> JudgeClient:
    config = JudgeConfig(base_url=server.base_url, model=server.model, max_retries=MAX_RETRIES, max_concurrency=2,
                         max_tokens=64, timeout_s=300)
    return JudgeClient(config, cache=cache, progress=False)


def _items() -> list[CaptionItem]:
    cands = [c for c in validate.make_candidates(2) if c.kind in ("identity", "paraphrase", "perturbed-2")]
    return [CaptionItem(f"demo/{n}", c.caption, c.reference, world.CAPTION_PROMPT) for n, c in enumerate(cands)]


def test_real_server_negotiates_json_object_second_run_hits_the_cache(server, tmp_path):
    items = _items()
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        first = _client(server, cache)
        results = score_captions(first, items, "detail")
        assert first.format_mode == "json_object_schema" and first.stats.format_fallbacks == 1
        sent = server.request_count()
        # our requests + the openai client's retries of the rejected json_schema probe
        assert sent == first.stats.requests_sent + MAX_RETRIES
        assert server.log_path.read_text().count('"POST /v1/chat/completions HTTP/1.1" 500') == 1 + MAX_RETRIES

        second = _client(server, cache)
        again = score_captions(second, items, "detail")
        assert server.request_count() == sent, "the second run sent requests despite the cache"
        assert second.stats.requests_sent == 0 and second.stats.cache_hits >= len(items)
        assert second.format_mode == "json_object_schema"  # remembered in the cache, no renegotiation
    assert [r["score"] for r in again] == [r["score"] for r in results]
    for r in results:
        assert r["score"] is None or 0 <= r["score"] <= 5
        assert (r["score"] is None) == bool(r["errors"])
    print({"scores": [r["score"] for r in results], "stats": first.stats.as_dict()})


def test_real_server_vdc_question_answer_mode(server, tmp_path):
    scene = world.make_scene(3)
    item = CaptionItem("demo/vdc", world.make_caption(scene), "", qa=validate.scene_qa(scene)[:2])
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        client = _client(server, cache)
        result = score_captions(client, [item], "vdc")[0]
    assert len(result["answers"]) == 2 and set(result["parts"]) == {"q0", "q1"}
    assert result["score"] is None or 0 <= result["score"] <= 5
    assert client.stats.judgments >= 2
