"""The judge against a real OpenAI-compatible server: llama-cpp-python serving SmolLM2-135M-Instruct.

No recordings here: a real server process on 127.0.0.1, the real openai client, real replies.
Checks the plumbing, not judging quality (a 135M model is no judge), as our contract rather than
one server version's behaviour: whichever response_format the server takes, the client settles on
one it supports, reached by falling back best-first; it is remembered in the cache, so a second
run sends nothing (counted in the server's own access log) and renegotiates nothing; every score
is 0-5, or missing with an error. And when the server process dies mid-run, the client stops
after a few connection failures with one error naming the endpoint, and what was judged stays
cached. Install the server with `make judge-server`; without it these tests skip.
"""
from __future__ import annotations

import threading
import time

import pytest

from judges import validate
from judges.cache import JudgeCache
from judges.client import CaptionItem, JudgeClient, JudgeUnreachableError, score_captions
from judges.config import FORMAT_MODES, JudgeConfig
from judges.server import JudgeServer, missing_reason
from lvspec_eval.demo import world

pytestmark = pytest.mark.judge_server
MAX_RETRIES = 1  # the openai client's own retries of a failed request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = missing_reason()
    if reason:
        pytest.skip(f"local judge server not available: {reason}")
    log_path = tmp_path_factory.mktemp("judge_server") / "server.log"
    with JudgeServer.start(log_path=log_path, n_threads=1) as running:
        yield running


def _client(server: JudgeServer, cache: JudgeCache, **overrides) -> JudgeClient:
    config = JudgeConfig(base_url=server.base_url, model=server.model, max_retries=MAX_RETRIES, max_concurrency=2,
                         max_tokens=64, timeout_s=300)
    return JudgeClient(config, cache=cache, progress=False, **overrides)


def _items(num_scenes: int = 2, kinds: tuple[str, ...] = ("identity", "paraphrase", "perturbed-2")) -> list[CaptionItem]:
    cands = [c for c in validate.make_candidates(num_scenes) if c.kind in kinds]
    return [CaptionItem(f"demo/{n}", c.caption, c.reference, world.CAPTION_PROMPT) for n, c in enumerate(cands)]


def _answered(server: JudgeServer) -> int:
    return server.log_path.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')


def test_real_server_negotiated_format_is_ours_and_cached_second_run_sends_nothing(server, tmp_path):
    items = _items()
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        first = _client(server, cache)
        results = score_captions(first, items, "detail")
        # whatever this server version takes, it is one of ours, reached best-first
        assert first.format_mode in FORMAT_MODES
        assert first.stats.format_fallbacks == FORMAT_MODES.index(first.format_mode)
        assert cache.get_format(first.endpoint, server.model) == first.format_mode
        sent = server.request_count()
        assert sent >= first.stats.requests_sent  # the server saw every request (and any retries)
        assert _answered(server) == cache.count()  # every reply it gave is cached

        second = _client(server, cache)
        assert second.format_mode == first.format_mode  # remembered before any request
        again = score_captions(second, items, "detail")
        assert server.request_count() == sent, "the second run sent requests despite the cache"
        assert second.stats.requests_sent == 0 and second.stats.format_fallbacks == 0
        assert second.stats.cache_hits >= len(items)
    assert [r["score"] for r in again] == [r["score"] for r in results]
    for r in results:
        assert r["score"] is None or 0 <= r["score"] <= 5
        assert (r["score"] is None) == bool(r["errors"])
    print({"format": first.format_mode, "scores": [r["score"] for r in results], "stats": first.stats.as_dict()})

def test_real_server_facts_mode_one_token_yes_no_and_a_second_run_sends_nothing(server, tmp_path):
    # one scene, identity and one wrong fact: kept short (a split generates a JSON list)
    cands = [c for c in validate.make_candidates(1) if c.kind in ("identity", "perturbed-1")][:2]
    items = [CaptionItem(f"demo/{n}", c.caption, c.reference, reference_facts=c.reference_facts)
             for n, c in enumerate(cands)]
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        first = _client(server, cache)
        results = score_captions(first, items, "facts")
        sent = server.request_count()
        assert first.stats.completion_tokens > 0 and first.stats.request_seconds > 0
        again = score_captions(_client(server, cache), items, "facts")
        assert server.request_count() == sent, "the second run sent requests despite the cache"
    assert [r["score"] for r in again] == [r["score"] for r in results]
    for r in results:
        assert r["score"] is None or 0 <= r["score"] <= 5
        assert (r["score"] is None) == bool(r["errors"])
        assert r["reference_facts_from"] == "task"
    # a facts judgment is one-token yes/no answers: at least one item must come back scored, or the
    # mode is broken however well its failures are reported
    assert any(r["score"] is not None for r in results), [r["errors"] for r in results]


def test_real_server_vdc_question_answer_mode(server, tmp_path):
    scene = world.make_scene(3)
    item = CaptionItem("demo/vdc", world.make_caption(scene), "", qa=validate.scene_qa(scene)[:2])
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        client = _client(server, cache)
        result = score_captions(client, [item], "vdc")[0]
    assert len(result["answers"]) == 2 and set(result["parts"]) == {"q0", "q1"}
    assert result["score"] is None or 0 <= result["score"] <= 5
    assert client.stats.judgments >= 2


def _kill_when_cached(server: JudgeServer, client: JudgeClient, count: int, seen: dict,
                      timeout_s: float = 300) -> threading.Thread:
    """Kill the server process (SIGKILL, as a crash would) once `count` replies are cached; note in
    `seen` how many requests the client had sent by then."""
    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while client.cache.count() < count and time.monotonic() < deadline:
            time.sleep(0.05)
        server.process.kill()
        seen["sent_at_kill"] = client.stats.requests_sent

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_server_killed_mid_run_stops_the_client_and_keeps_what_was_judged(tmp_path):
    reason = missing_reason()
    if reason:
        pytest.skip(f"local judge server not available: {reason}")
    items = _items(3, kinds=("identity", "paraphrase", "perturbed-1"))  # 15 captions
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        with JudgeServer.start(log_path=tmp_path / "dying.log", n_threads=1) as dying:
            client, seen = _client(dying, cache, max_concurrency=1), {}
            watcher = _kill_when_cached(dying, client, 3, seen)
            with pytest.raises(JudgeUnreachableError, match="did not answer 3 requests in a row") as err:
                score_captions(client, items, "detail")
            watcher.join()
            assert dying.process.poll() is not None
        assert dying.base_url in str(err.value)
        kept = cache.count()
        assert 3 <= kept < len(items)
        # after the kill: the three requests that failed in a row, nothing more
        assert client.stats.requests_sent - seen["sent_at_kill"] <= 3

        with JudgeServer.start(log_path=tmp_path / "fresh.log", n_threads=1) as fresh:
            rerun = _client(fresh, cache)
            results = score_captions(rerun, items, "detail")
    assert rerun.stats.cache_hits == kept and rerun.stats.requests_sent >= len(items) - kept
    assert all(r["score"] is None or 0 <= r["score"] <= 5 for r in results)
