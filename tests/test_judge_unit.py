"""Judge client, cache and CLI on recorded replies.

The fake server is an httpx2.MockTransport handed to the real openai client as its http_client,
so every request goes through the openai client's own code (serialisation, status handling,
retries) and only the network is replaced.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
from pathlib import Path

import httpx2
import pytest

from judges import cli as judge_cli
from judges import prompts
from judges.cache import JudgeCache
from judges.client import (CaptionItem, JudgeClient, JudgeRequest, JudgeSetupError, JudgeUnreachableError,
                           score_captions)
from judges.config import JudgeConfig

SECRET = "sk-test-secret-0123456789"


class FakeJudge:
    """An OpenAI-compatible endpoint: `reply(body) -> text`, optional rejected formats/statuses."""

    def __init__(self, reply=None, reject: tuple[str, ...] = (), status: int = 500) -> None:
        self.reply = reply or (lambda body: '{"score": 4}')
        self.reject, self.status = reject, status
        self.bodies: list[dict] = []
        self.requests: list[httpx2.Request] = []
        self._lock = threading.Lock()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        with self._lock:
            self.bodies.append(body)
            self.requests.append(request)
        format_ = body.get("response_format") or {}
        mode = format_.get("type", "text") + ("_schema" if "schema" in format_ else "")
        if mode in self.reject:
            return httpx2.Response(self.status, json={"error": {"message": f"{mode} not supported"}})
        message = {"role": "assistant", "content": self.reply(body)}
        return httpx2.Response(200, json={
            "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def http_client(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.MockTransport(self))


def make_client(fake: FakeJudge, cache: JudgeCache | None = None, **overrides) -> JudgeClient:
    config = JudgeConfig(model="judge-x", base_url="http://judge.test/v1", max_retries=0)
    return JudgeClient(config, cache=cache, http_client=fake.http_client(), progress=False, **overrides)


def detail_request(caption: str = "a red square") -> JudgeRequest:
    return JudgeRequest(prompts.DETAIL, prompts.detail_messages("Describe.", "a red square", caption))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_URL", "OPENAI_API_BASE", "API_TYPE",
                 "MODEL_VERSION", "AZURE_API_KEY", "AZURE_OPENAI_API_KEY", "AZURE_ENDPOINT",
                 "AZURE_OPENAI_ENDPOINT", "AZURE_API_VERSION", "API_VERSION", "OPENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------------------
# Configuration


def test_env_full_chat_completions_url_is_stripped_to_base():
    config = JudgeConfig.from_env({"OPENAI_API_URL": "http://h:8000/v1/chat/completions", "MODEL_VERSION": "m"})
    assert config.base_url == "http://h:8000/v1"
    assert config.model == "m"


def test_env_openai_base_url_wins_and_overrides_win_over_env():
    env = {"OPENAI_BASE_URL": "http://a/v1", "OPENAI_API_URL": "http://b/v1", "API_TYPE": "OpenAI"}
    assert JudgeConfig.from_env(env).base_url == "http://a/v1"
    assert JudgeConfig.from_env(env).api_type == "openai"
    assert JudgeConfig.from_env(env, base_url="http://c/v1/", model=None).base_url == "http://c/v1"


def test_config_errors_name_the_value_and_the_allowed_ones():
    with pytest.raises(ValueError, match=r"api_type='anthropic'.*openai, azure"):
        JudgeConfig(api_type="anthropic")
    with pytest.raises(ValueError, match=r"response_format='xml'.*json_schema"):
        JudgeConfig(response_format="xml")
    with pytest.raises(ValueError, match="AZURE_ENDPOINT"):
        JudgeConfig.from_env({"API_TYPE": "azure"})
    with pytest.raises(ValueError, match="unknown judge setting"):
        JudgeConfig.from_env({}, api_key="x")


def test_key_is_sent_but_never_in_repr_describe_or_results(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fake = FakeJudge()
    client = make_client(fake)
    results = score_captions(client, [CaptionItem("t/0", "a red square", "a red square")], "detail")
    assert fake.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    for text in (repr(client), json.dumps(client.describe()), json.dumps(results), repr(client.config)):
        assert SECRET not in text


def test_azure_uses_deployment_url_api_version_and_api_key_header(monkeypatch):
    monkeypatch.setenv("AZURE_API_KEY", SECRET)
    env = {"API_TYPE": "azure", "AZURE_ENDPOINT": "https://res.test", "API_VERSION": "2024-06-01",
           "MODEL_VERSION": "gpt-4o-dep"}
    fake = FakeJudge()
    client = JudgeClient(JudgeConfig.from_env(env, max_retries=0), http_client=fake.http_client(), progress=False)
    assert client.judge(detail_request()).value == {"score": 4}
    url = fake.requests[0].url
    assert url.path == "/openai/deployments/gpt-4o-dep/chat/completions"
    assert url.params["api-version"] == "2024-06-01"
    assert fake.requests[0].headers["api-key"] == SECRET
    assert SECRET not in repr(client) + json.dumps(client.describe())


# ---------------------------------------------------------------------------------------------
# Format negotiation, decoding parameters, retries


def test_json_schema_is_tried_first_and_kept_when_accepted():
    fake = FakeJudge()
    client = make_client(fake)
    client.judge(detail_request("a"))
    client.judge(detail_request("b"))
    assert [b["response_format"]["type"] for b in fake.bodies] == ["json_schema", "json_schema"]
    assert fake.bodies[0]["response_format"]["json_schema"]["schema"] == prompts.DETAIL.schema
    assert client.format_mode == "json_schema"


def test_rejected_json_schema_falls_back_to_json_object_with_schema_once():
    fake = FakeJudge(reject=("json_schema",), status=500)  # what llama-cpp-python's server does
    client = make_client(fake)
    assert client.judge(detail_request("a")).value == {"score": 4}
    assert client.judge(detail_request("b")).value == {"score": 4}
    kinds = [(b.get("response_format") or {}).get("type") for b in fake.bodies]
    assert kinds == ["json_schema", "json_object", "json_object"]
    assert fake.bodies[1]["response_format"]["schema"] == prompts.DETAIL.schema
    assert client.format_mode == "json_object_schema" and client.stats.format_fallbacks == 1


def test_server_rejecting_the_schema_key_gets_plain_json_object():
    fake = FakeJudge(reject=("json_schema", "json_object_schema"), status=400)
    client = make_client(fake)
    assert client.judge(detail_request()).value == {"score": 4}
    assert fake.bodies[-1]["response_format"] == {"type": "json_object"} and client.format_mode == "json_object"
    assert client.stats.format_fallbacks == 2


def test_server_taking_no_response_format_gets_plain_text():
    fake = FakeJudge(reply=lambda body: 'Here you go: {"score": 3} hope it helps',
                     reject=("json_schema", "json_object_schema", "json_object"), status=422)
    client = make_client(fake)
    assert client.judge(detail_request()).value == {"score": 3}
    assert "response_format" not in fake.bodies[-1] and client.format_mode == "text"


def test_auth_error_is_not_taken_for_a_format_problem_and_does_not_leak_the_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fake = FakeJudge(reject=("json_schema",), status=401)
    with pytest.raises(JudgeSetupError, match="HTTP 401") as caught:
        make_client(fake).judge(detail_request())
    assert len(fake.bodies) == 1
    assert SECRET[:8] not in str(caught.value) and caught.value.__cause__ is None


def test_unknown_model_stops_with_the_servers_reason_and_no_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    def handler(request):
        return httpx2.Response(404, json={"error": {"message": f"model judge-x not found (key {SECRET})"}})

    config = JudgeConfig(model="judge-x", base_url="http://judge.test/v1", max_retries=0)
    client = JudgeClient(config, http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), progress=False)
    with pytest.raises(JudgeSetupError, match="model judge-x not found") as caught:
        client.judge(detail_request())
    assert SECRET not in str(caught.value)


def test_greedy_fixed_seed_and_schema_in_prompt():
    fake = FakeJudge()
    make_client(fake, seed=7).judge(detail_request())
    body = fake.bodies[0]
    assert body["temperature"] == 0 and body["seed"] == 7 and body["model"] == "judge-x"
    assert '"score"' in body["messages"][0]["content"]  # the reply schema, in the system prompt


def test_unparsable_reply_is_asked_again_with_the_reason():
    replies = iter(["I think it is good", '{"score": 5}'])
    fake = FakeJudge(reply=lambda body: next(replies))
    judgment = make_client(fake).judge(detail_request())
    assert judgment.value == {"score": 5} and judgment.asks == 2
    reask = fake.bodies[1]["messages"]
    assert reask[-2] == {"role": "assistant", "content": "I think it is good"}
    assert "could not be read" in reask[-1]["content"]


def test_reply_failing_validation_is_missing_not_zero():
    fake = FakeJudge(reply=lambda body: '{"score": 9}')
    client = make_client(fake, parse_retries=2)
    judgment = client.judge(detail_request())
    assert judgment.value is None and "not in [0, 1, 2, 3, 4, 5]" in judgment.error
    assert len(fake.bodies) == 3 and client.stats.missing == 1 and client.stats.failure_rate == 1.0
    result = score_captions(client, [CaptionItem("t/0", "x", "y")], "detail")[0]
    assert result["score"] is None and result["errors"]


def test_server_error_after_retries_is_recorded_missing_with_reason():
    fake = FakeJudge(reject=("json_schema", "json_object_schema", "json_object", "text"),
                     status=503)
    judgment = make_client(fake).judge(detail_request())
    assert judgment.value is None and "InternalServerError" in judgment.error


# ---------------------------------------------------------------------------------------------
# Cache and concurrency


def test_second_run_is_served_from_the_cache_including_the_format(tmp_path):
    path = tmp_path / "cache.sqlite"
    fake = FakeJudge(reject=("json_schema",))
    with JudgeCache(path) as cache:
        make_client(fake, cache=cache).judge_many([detail_request(str(i)) for i in range(5)])
    sent = len(fake.bodies)
    with JudgeCache(path) as cache:
        client = make_client(fake, cache=cache)
        judged = client.judge_many([detail_request(str(i)) for i in range(5)])
        assert cache.count() == 5
    assert len(fake.bodies) == sent and client.stats.requests_sent == 0 and client.stats.cache_hits == 5
    assert all(j.cached and j.value == {"score": 4} for j in judged)
    assert client.format_mode == "json_object_schema"


def test_interrupted_run_resumes_without_asking_again(tmp_path):
    path = tmp_path / "cache.sqlite"
    fake = FakeJudge()
    items = [CaptionItem(f"t/{i}", f"caption {i}", "ref") for i in range(6)]
    with JudgeCache(path) as cache:
        score_captions(make_client(fake, cache=cache), items[:3], "detail")  # "interrupted" after 3
    with JudgeCache(path) as cache:
        client = make_client(fake, cache=cache)
        results = score_captions(client, items, "detail")
    assert client.stats.requests_sent == 3 and len(fake.bodies) == 6
    assert [r["score"] for r in results] == [4.0] * 6


def test_cache_key_depends_on_model_prompt_version_and_params():
    fake = FakeJudge()
    cache = JudgeCache()
    make_client(fake, cache=cache).judge(detail_request())
    make_client(fake, cache=cache, model="judge-y").judge(detail_request())
    make_client(fake, cache=cache, seed=99).judge(detail_request())
    newer = JudgeRequest(dataclasses.replace(prompts.DETAIL, version="next"), detail_request().messages)
    make_client(fake, cache=cache).judge(newer)
    make_client(fake, cache=cache).judge(detail_request())  # the first one again: cached
    assert len(fake.bodies) == 4 and cache.count() == 4


def test_concurrent_judgments_keep_order_and_are_all_cached():
    fake = FakeJudge(reply=lambda body: json.dumps({"score": len(body["messages"][-1]["content"]) % 6}))
    cache = JudgeCache()
    client = make_client(fake, cache=cache, max_concurrency=4)
    requests = [detail_request("x" * i) for i in range(24)]
    judged = client.judge_many(requests)
    expected = [len(r.messages[-1]["content"]) % 6 for r in requests]
    assert [j.value["score"] for j in judged] == expected
    assert cache.count() == 24 and client.stats.judgments == 24


# ---------------------------------------------------------------------------------------------
# Modes


def test_vcgpt_asks_five_criteria_and_a_missing_one_leaves_the_score_missing():
    def reply(body):
        system = body["messages"][0]["content"]
        return "no idea" if "Temporal understanding" in system else '{"score": 3}'

    results = score_captions(make_client(FakeJudge(reply), parse_retries=0),
                             [CaptionItem("t/0", "c", "r")], "vcgpt")
    parts = results[0]["parts"]
    assert set(parts) == {"correctness", "detail", "context", "temporal", "consistency"}
    assert parts["temporal"] is None and parts["correctness"] == 3 and results[0]["score"] is None


def test_vcgpt_parts_go_back_to_their_own_caption_and_criterion():
    def reply(body):
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        digit = int(user.split("Predicted answer: caption ")[1][0])
        return json.dumps({"score": digit + ("Correctness of information" in system)})

    fake = FakeJudge(reply)
    items = [CaptionItem(f"t/{n}", f"caption {n}", "r") for n in range(3)]
    results = score_captions(make_client(fake, max_concurrency=1), items, "vcgpt")
    for n, r in enumerate(results):
        assert r["parts"] == {"correctness": n + 1, "detail": n, "context": n, "temporal": n, "consistency": n}
    firsts = [b["messages"][0]["content"] for b in fake.bodies[:3]]
    assert len(set(firsts)) == 1, "one criterion's requests are sent together (shared prompt prefix)"


def test_vdc_answers_from_the_caption_then_marks_each_answer():
    def reply(body):
        user = body["messages"][-1]["content"]
        if user.startswith("Description:"):
            return '{"answer": "red"}'
        right = "Correct answer: red" in user
        return json.dumps({"pred": "yes" if right else "no", "score": 5 if right else 1})

    fake = FakeJudge(reply)
    item = CaptionItem("vdc/3", "A red square.", "ref", qa=(("Colour?", "red"), ("Shape?", "circle")))
    result = score_captions(make_client(fake), [item], "vdc")[0]
    assert result["score"] == 3.0 and result["acc"] == 0.5 and len(fake.bodies) == 4
    assert result["answers"][1] == {"question": "Shape?", "reference": "circle", "answer": "red", "pred": "no"}


def test_unknown_mode_and_vdc_without_questions_are_rejected():
    client = make_client(FakeJudge())
    with pytest.raises(ValueError, match=r"mode='bleu'.*detail, vcgpt, vdc"):
        score_captions(client, [], "bleu")
    with pytest.raises(ValueError, match="question-answer"):
        score_captions(client, [CaptionItem("t/0", "c", "r")], "vdc")


# ---------------------------------------------------------------------------------------------
# CLI: `lvspec-eval judge` on an lmms-eval 0.7.3 samples file


def _write_samples(folder: Path) -> Path:
    path = folder / "qwen" / "20250101_120000_samples_demo_caption.jsonl"
    path.parent.mkdir(parents=True)
    lines = [
        {"doc_id": 0, "target": "There is one object.", "filtered_resps": "There is one red square.",
         "input": "Describe the video in detail.", "doc_hash": "h0", "token_counts": [None]},
        {"doc_id": 1, "target": "There are two objects.", "filtered_resps": [["Two objects."]],
         "resps": [["Two objects. <eos>"]], "input": "Describe."},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_read_samples_follows_lmms_eval_keys(tmp_path):
    items = judge_cli.read_samples(_write_samples(tmp_path))
    assert [i.key for i in items] == ["demo_caption/0", "demo_caption/1"]
    assert items[1].caption == "Two objects." and items[0].reference == "There is one object."
    assert items[0].question == "Describe the video in detail."


def _main(argv: list[str]) -> int:
    """`lvspec-eval` with only our sub-commands (the full CLI imports every command's module)."""
    import argparse

    parser = argparse.ArgumentParser(prog="lvspec-eval")
    judge_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_judge_command_writes_scores_keyed_by_task_and_doc_id(tmp_path, monkeypatch, capsys):
    fake = FakeJudge()
    monkeypatch.setattr(judge_cli, "JudgeClient", functools.partial(JudgeClient, http_client=fake.http_client()))
    _write_samples(tmp_path / "run")
    out = tmp_path / "judged.jsonl"
    argv = ["judge", str(tmp_path / "run"), "--out", str(out), "--base-url", "http://judge.test/v1",
            "--model", "judge-x", "--max-retries", "0", "--cache", str(tmp_path / "c.sqlite"), "--no-progress"]
    assert _main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task"], r["doc_id"], r["score"]) for r in rows] == [("demo_caption", 0, 4.0), ("demo_caption", 1, 4.0)]
    summary = json.loads(capsys.readouterr().out)
    assert summary["missing"] == 0 and summary["judge"]["format_mode"] == "json_schema"


def test_judge_command_rejects_a_missing_path(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        judge_cli.sample_files([tmp_path / "nope"])


def test_served_judge_settings_win_over_unset_options():
    import argparse

    parser = argparse.ArgumentParser()
    judge_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["judge-check", "--serve"])
    config = judge_cli._config(args, base_url="http://127.0.0.1:9/v1", model="smollm2", api_type="openai")
    assert (config.base_url, config.model, config.response_format) == ("http://127.0.0.1:9/v1", "smollm2", "auto")


# ---------------------------------------------------------------------------------------------
# A judge that goes away: stop after a few connection failures in a row, keep what was judged.
# Real sockets on 127.0.0.1 where that is cheap (a listener that hangs up, one that never answers).


class Listener:
    """A real TCP listener on 127.0.0.1 that accepts every connection and then either closes it at
    once (`hang_up`, like a server process that died mid-request) or holds it without a word."""

    def __init__(self, hang_up: bool = True) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.hang_up, self.accepted, self.held = hang_up, 0, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by close()
                return
            self.accepted += 1
            if self.hang_up:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_judge_that_hangs_up_stops_the_run_after_three_failures_naming_the_endpoint(caplog):
    listener = Listener(hang_up=True)
    try:
        config = JudgeConfig(model="m", base_url=listener.base_url, max_retries=0, max_concurrency=1)
        client = JudgeClient(config, progress=False)
        with pytest.raises(JudgeUnreachableError, match="did not answer 3 requests in a row") as err:
            client.judge_many([detail_request(str(i)) for i in range(20)])
    finally:
        listener.close()
    assert listener.base_url in str(err.value)
    assert listener.accepted == 3 and client.stats.requests_sent == 3  # the other 17 were never sent
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) <= 2


def test_judge_that_stops_answering_times_out_and_stops():
    listener = Listener(hang_up=False)
    try:
        config = JudgeConfig(model="m", base_url=listener.base_url, max_retries=0, max_concurrency=2,
                             timeout_s=0.3, max_connection_failures=2)
        client = JudgeClient(config, progress=False)
        with pytest.raises(JudgeUnreachableError, match="2 requests in a row.*APITimeoutError"):
            client.judge_many([detail_request(str(i)) for i in range(10)])
    finally:
        listener.close()
    assert client.stats.requests_sent <= 3  # two in flight at once, at most one more after the first


class DyingJudge(FakeJudge):
    """Answers `alive` requests, then refuses every connection (the process is gone)."""

    def __init__(self, alive: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.alive, self.refused = alive, 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        with self._lock:
            gone = len(self.bodies) >= self.alive
            self.refused += gone
        if gone:
            raise httpx2.ConnectError("connection refused", request=request)
        return super().__call__(request)


def test_judgments_made_before_the_judge_died_stay_cached_and_a_rerun_resumes(tmp_path):
    path = tmp_path / "cache.sqlite"
    items = [CaptionItem(f"t/{i}", f"caption {i}", "ref") for i in range(8)]
    dying = DyingJudge(alive=5)
    with JudgeCache(path) as cache:
        with pytest.raises(JudgeUnreachableError, match=r"judge at http://judge.test/v1 .*stopped after 5 judgments"):
            score_captions(make_client(dying, cache=cache, max_concurrency=1), items, "detail")
        assert cache.count() == 5
    assert dying.refused == 3
    fresh = FakeJudge()
    with JudgeCache(path) as cache:
        client = make_client(fresh, cache=cache)
        results = score_captions(client, items, "detail")
    assert client.stats.cache_hits == 5 and len(fresh.bodies) == 3
    assert [r["score"] for r in results] == [4.0] * 8


def test_failures_that_are_not_in_a_row_are_missing_judgments_not_a_stop():
    class Flaky(FakeJudge):
        def __call__(self, request):
            with self._lock:
                self.calls = getattr(self, "calls", 0) + 1
                fail = self.calls % 2 == 0
            if fail:
                raise httpx2.ConnectError("connection reset", request=request)
            return super().__call__(request)

    client = make_client(Flaky(), max_concurrency=1, max_connection_failures=2)
    judged = client.judge_many([detail_request(str(i)) for i in range(6)])
    assert [j.value is None for j in judged] == [False, True] * 3
    assert all("APIConnectionError" in j.error for j in judged if j.value is None)


def test_judge_check_against_a_dead_endpoint_is_one_error_and_exit_code_3(tmp_path, capsys):
    listener = Listener(hang_up=True)
    try:
        code = _main(["judge-check", "--num-scenes", "2", "--base-url", listener.base_url, "--model", "m",
                      "--max-retries", "0", "--cache", str(tmp_path / "c.sqlite"), "--out",
                      str(tmp_path / "r.json"), "--no-progress"])
    finally:
        listener.close()
    err = capsys.readouterr().err
    assert code == 3 and not (tmp_path / "r.json").exists()
    assert f"lvspec-eval judge-check: error: judge at {listener.base_url} did not answer 3 requests" in err


def test_serve_takes_a_named_model_or_a_gguf_path(tmp_path, monkeypatch):
    from judges import server

    with pytest.raises(ValueError, match="'nope'.*allowed: smollm2-135m, qwen2.5-coder-1.5b"):
        server.resolve_model("nope")
    monkeypatch.setenv(server.GGUF_DIR_ENV, str(tmp_path))
    wrong = tmp_path / "qwen2.5-coder-1.5b-instruct.gguf"
    wrong.write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="has 4 bytes, not the 1117320768"):
        server.resolve_model("qwen2.5-coder-1.5b")
    assert server.resolve_model(str(wrong)) == (wrong, "qwen2.5-coder-1.5b-instruct")
