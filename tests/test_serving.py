"""Served models: the openai backend against a real ``transformers serve`` on the embedded tiny
model, and a fake server for faults a real one does not produce."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

import perfsdk
from perfsdk.plugins import hookimpl
from perfsdk.store import Store

from servers import FakeServer, TransformersServe, completion_events, serving_available, sse

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir():
    from perfsdk.models.tiny import ensure_tiny_llama

    return ensure_tiny_llama("tiny-llama")


@pytest.fixture(scope="module")
def served(tiny_dir):
    why = serving_available()
    if why:
        pytest.skip(why)
    server = TransformersServe(tiny_dir)
    log = Path(server.log.name)
    assert log.parent == Path(tempfile.gettempdir()) and log.exists()
    yield server
    server.stop()
    assert not log.exists()  # a server that ran leaves nothing behind


def steps_seen(with_warmup: bool = False) -> tuple[type, list[Any]]:
    """A collector class that keeps every step it is told about (measured ones only, unless
    ``with_warmup``), and the list it keeps them in."""
    seen: list[Any] = []

    class Steps(perfsdk.Collector):
        name = "steps_seen"

        @hookimpl
        def perfsdk_after_generate(self, session, step):
            if with_warmup or not step.warmup:
                seen.append(step)

    return Steps, seen


def served_config(url: str, model: Any, **workload: Any) -> dict[str, Any]:
    wl = {"num_prompts": 6, "warmup_runs": 1, "generate": {"max_new_tokens": 8}, **workload}
    return {"name": "served", "model": {"endpoint": url, "id": str(model)}, "workload": wl,
            "collectors": {"utilization": False, "energy": False}}


def run_served(cfg: dict[str, Any], tmp_path, collectors: list[Any] | None = None) -> perfsdk.RunResult:
    from perfsdk.models.runner import run_workload

    with perfsdk.session(cfg, store=str(tmp_path / "store"), collectors=collectors or []) as s:
        run_workload(s)
    assert s.result is not None
    return s.result


# -- against the real server ------------------------------------------------------------------


def test_token_counts_ttft_and_itl_from_the_stream(served, tiny_dir, tmp_path):
    Steps, seen = steps_seen()
    res = run_served(served_config(served.url, tiny_dir), tmp_path, collectors=[Steps])
    assert res.status == "ok", res.errors
    lat = res.collectors["latency"]
    # every request streamed its 8 tokens, and the server's usage said so
    assert lat["requests"] == 6 and lat["output_tokens"] == 6 * 8
    assert lat["token_source"] == "usage" and lat["usage_mismatches"] == 0
    # a stream that falls behind may join several tokens' texts into one event (transformers serve
    # does from 5.25): such a request has fewer events than tokens, and the events that carried
    # several tokens are counted
    assert len(seen) == 6
    for step in seen:
        assert 1 <= step.served.chunks <= 8
        assert (step.served.multi_token_chunks > 0) == (step.served.chunks < 8)
        assert step.served.multi_token_chunks <= 8 - step.served.chunks
    assert lat["multi_token_chunks"] == sum(step.served.multi_token_chunks for step in seen)
    assert lat["ttft_s"]["count"] == 6 and lat["tpot_s"]["count"] == 6
    assert lat["itl_s"]["count"] == 6 * 7  # every gap between the 8 tokens of each request
    assert lat["errors"] == 0 and lat["error_rate"] == 0.0
    assert lat["warmup_steps"] == 1 and lat["concurrency_max"] == 1
    # prompt tokens are the server's count, the same as the model's own tokenizer gives
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    reqs = Store(tmp_path / "store").read_series(res.run_id, "requests")
    assert len(reqs) == 6 and all(r["output_tokens"] == 8 for r in reqs)
    assert res.model is not None and res.model.model_class == "served (openai)"
    assert res.workload is not None and res.workload.timed_runs == 6
    assert lat["input_tokens"] == sum(r["input_tokens"] for r in reqs)
    assert tok is not None


def test_closed_loop_users_and_open_loop_schedule(served, tiny_dir, tmp_path):
    res = run_served(served_config(served.url, tiny_dir, num_prompts=8, load={"mode": "concurrency",
                                                                             "concurrency": 3}), tmp_path / "a")
    lat = res.collectors["latency"]
    assert lat["requests"] == 8 and 2 <= lat["concurrency_max"] <= 3
    # open loop at 20 requests/s, constant gaps: sends scheduled 50 ms apart whatever the server does
    Steps, seen = steps_seen()

    res = run_served(served_config(served.url, tiny_dir, num_prompts=6,
                                   load={"mode": "rate", "rate_per_s": 20, "arrival": "constant"}),
                     tmp_path / "b", collectors=[Steps])
    sched = sorted(s.served.scheduled_ns for s in seen)
    assert len(sched) == 6
    assert all(b - a == 50_000_000 for a, b in zip(sched, sched[1:]))
    lat = res.collectors["latency"]
    assert lat["queue_s"]["count"] == 6 and lat["ttft_from_scheduled_s"]["count"] == 6
    # latency from the schedule is never shorter than from the actual send
    assert lat["ttft_from_scheduled_s"]["min"] >= lat["ttft_s"]["min"]
    assert res.workload.arrival_pattern == "rate constant"


def test_goodput_under_slos(served, tiny_dir, tmp_path):
    loose = run_served(served_config(served.url, tiny_dir, slo={"ttft_s": 60, "tpot_s": 60, "e2e_s": 60}),
                       tmp_path / "a").collectors["latency"]
    assert loose["goodput_share"] == 1.0 and loose["goodput"] == pytest.approx(loose["requests_per_s"])
    assert loose["slo"] == {"ttft_s": 60.0, "tpot_s": 60.0, "e2e_s": 60.0}
    tight = run_served(served_config(served.url, tiny_dir, slo={"ttft_s": 1e-6}), tmp_path / "b")
    assert tight.collectors["latency"]["goodput_share"] == 0.0 and tight.collectors["latency"]["goodput"] == 0.0


def test_a_third_party_collector_gets_every_hook_on_a_served_run(served, tiny_dir, tmp_path):
    calls: dict[str, int] = {}

    class HookCounter(perfsdk.Collector):
        name = "hookcounter"

        def _seen(self, hook: str) -> None:
            calls[hook] = calls.get(hook, 0) + 1

        @hookimpl
        def perfsdk_session_start(self, session):
            self._seen("session_start")

        @hookimpl
        def perfsdk_load(self, session, event):
            self._seen("load")

        @hookimpl
        def perfsdk_before_generate(self, session, step):
            self._seen("before_generate")

        @hookimpl
        def perfsdk_after_generate(self, session, step):
            self._seen("after_generate")
            assert step.output_tokens == [8] and len(step.token_times_ns) == 8

        @hookimpl
        def perfsdk_window_open(self, session, window):
            self._seen("window_open")

        @hookimpl
        def perfsdk_window_close(self, session, window):
            self._seen("window_close")

        @hookimpl
        def perfsdk_finalize(self, session):
            self._seen("finalize")
            return None

    run_served(served_config(served.url, tiny_dir, num_prompts=3), tmp_path, collectors=[HookCounter])
    assert calls["session_start"] == 1 and calls["load"] == 1 and calls["finalize"] == 1
    assert calls["before_generate"] == calls["after_generate"] == 4  # 1 warm-up + 3 requests
    assert calls["window_open"] == calls["window_close"] >= 2  # the session and the requests window


def test_collectors_that_need_the_model_say_so(served, tiny_dir, tmp_path):
    cfg = served_config(served.url, tiny_dir, num_prompts=2)
    cfg["collectors"].update({"layers": {}, "torch_profiler": {}, "flops": {"hardware": "host-cpu"},
                              "simulation": {}})
    res = run_served(cfg, tmp_path)
    assert res.status == "ok", res.errors
    for name in ("layers", "torch_profiler"):
        assert res.collectors[name]["status"] == "unavailable"
        assert res.collectors[name]["reason"] == "the model runs in another process"
    flops = res.collectors["flops"]
    # counted from the model's config for each request's real token counts
    assert flops["status"] == "ok" and flops["flops_decode"] > 0 and flops["mfu_pct"] > 0
    sim = res.collectors["simulation"]
    assert sim["status"] == "ok" and set(sim["comparison"]) >= {"prefill", "decode"}


def test_server_killed_mid_run_keeps_what_was_measured(tiny_dir, tmp_path):
    if serving_available():
        pytest.skip(serving_available())
    server = TransformersServe(tiny_dir)

    class Killer(perfsdk.Collector):
        name = "killer"
        done = 0

        @hookimpl
        def perfsdk_after_generate(self, session, step):
            if not step.warmup:
                Killer.done += 1
                if Killer.done == 3:
                    server.stop()

    try:
        res = run_served(served_config(server.url, tiny_dir, num_prompts=8), tmp_path, collectors=[Killer])
    finally:
        server.stop()
    assert res.status == "partial"
    lat = res.collectors["latency"]
    assert lat["requests"] == 3 and lat["errors"] == 5 and lat["error_rate"] == pytest.approx(5 / 8)
    assert lat["first_error"]
    assert any(e.source == "backend:openai" and "5 of 8 requests failed" in e.message for e in res.errors)
    stored = Store(tmp_path / "store").get(res.run_id)
    assert stored.collectors["latency"]["requests"] == 3


def test_cli_runs_a_served_model_without_a_file_and_stores_an_ordinary_run(served, tiny_dir, tmp_path, perfsdk_cli):
    store = tmp_path / "store"
    args = ["run", "--set", f"model.endpoint={served.url}", "--set", f"model.id={tiny_dir}",
            "--set", "workload.num_prompts=3", "--set", "workload.generate.max_new_tokens=4",
            "--set", "workload.slo={ttft_s: 30}", "--store", str(store)]
    r = perfsdk_cli(args)
    assert r.exit_code == 0, r.output
    assert "goodput" in r.output and "errors" in r.output and "token counts from" in r.output
    r2 = perfsdk_cli(args)
    assert r2.exit_code == 0
    csv = perfsdk_cli(["export", "--format", "csv", "--store", str(store), "--output", "-"])
    header = csv.output.splitlines()[0].split(",")
    assert "collectors.latency.goodput" in header and "collectors.latency.error_rate" in header
    ids = Store(store).run_ids()
    cmp = perfsdk_cli(["compare", ids[0], ids[1], "--store", str(store)])
    assert cmp.exit_code == 0, cmp.output
    rep = perfsdk_cli(["report", ids[0], "--store", str(store), "--output", str(tmp_path / "r.html")])
    assert rep.exit_code == 0 and (tmp_path / "r.html").read_text().count("Latency") >= 1


def test_the_serve_example_runs_as_shipped(served, tmp_path, perfsdk_cli):
    """examples/serve.yaml against transformers serve on the embedded model: builtin:tiny-llama
    names the model's cached folder, the path the server loaded it from."""
    example = Path(__file__).parent.parent / "examples" / "serve.yaml"
    r = perfsdk_cli(["run", str(example), "--set", f"model.endpoint={served.url}", "--set", "workload.num_prompts=4",
                     "--set", "workload.load.concurrency=2", "--set", "collectors.utilization.interval_s=0.5",
                     "--store", str(tmp_path / "store")])
    assert r.exit_code in (0, 1), r.output  # 1: partial when a collector is unavailable here
    run = Store(tmp_path / "store").get(Store(tmp_path / "store").resolve_run_id("latest"))
    lat = run.collectors["latency"]
    assert lat["requests"] == 4 and lat["errors"] == 0 and lat["goodput"] is not None
    assert run.collectors["flops"]["status"] == "ok" and run.collectors["flops"]["mfu_pct"] > 0
    for text in ("goodput", "errors", "MFU", "Utilization", "Energy"):
        assert text in r.output


# -- errors before anything runs ----------------------------------------------------------------


def test_refused_connection_and_wrong_url_exit_2_and_store_nothing(tmp_path, perfsdk_cli):
    from servers import free_port

    store = tmp_path / "store"
    port = free_port()
    r = perfsdk_cli(["run", "--set", f"model.endpoint=http://127.0.0.1:{port}/v1", "--store", str(store)])
    assert r.exit_code == 2
    assert f"model.endpoint: cannot reach http://127.0.0.1:{port}/v1" in r.output
    fake = FakeServer(lambda body: [])
    try:
        r = perfsdk_cli(["run", "--set", f"model.endpoint=http://127.0.0.1:{fake.port}/nope", "--store", str(store)])
    finally:
        fake.stop()
    assert r.exit_code == 2
    assert f"model.endpoint: http://127.0.0.1:{fake.port}/nope/models answered HTTP 404" in r.output
    assert "(the endpoint usually ends in /v1)" in r.output
    assert not store.exists() or not Store(store).run_ids()


# -- faults only a fake server produces ------------------------------------------------------------


def fake_config(url: str, **workload: Any) -> dict[str, Any]:
    cfg = served_config(url, "fake-model", **workload)
    cfg["workload"].setdefault("warmup_runs", 0)
    return cfg


def test_multi_token_chunks_are_spread_counted_and_flagged(tmp_path):
    # three events of two tokens each (the server's usage says 6)
    fake = FakeServer(lambda body: completion_events(["ab", "cd", "ef"], usage=6, gap_s=0.02))
    Steps, seen = steps_seen(with_warmup=True)

    try:
        res = run_served(fake_config(fake.url, num_prompts=2, warmup_runs=0), tmp_path, collectors=[Steps])
    finally:
        fake.stop()
    lat = res.collectors["latency"]
    assert lat["output_tokens"] == 12 and lat["token_source"] == "usage"
    # without a tokenizer to tell, the 3 extra tokens go evenly: every event carries 2
    assert lat["multi_token_chunks"] == 2 * 3
    step = seen[0]
    assert step.served.chunks == 3 and len(step.token_times_ns) == 6
    times = step.token_times_ns
    assert times == sorted(times)
    # the second event's two tokens sit inside its gap: half-way, then at the event
    assert times[-1] - times[-2] == pytest.approx(times[-2] - times[-3], abs=2)


def test_chat_role_only_first_event_is_not_the_first_token(tmp_path):
    fake = FakeServer(lambda body: [(0.05, completion_events(["x"], usage=None, chat=True)[0][1])]
                      + completion_events(["a", "b", "c"], usage=None, chat=True, gap_s=0.01)[1:])
    Steps, seen = steps_seen(with_warmup=True)

    cfg = fake_config(fake.url, num_prompts=1)
    cfg["model"]["api"] = "chat"
    try:
        res = run_served(cfg, tmp_path, collectors=[Steps])
    finally:
        fake.stop()
    assert fake.requests[0]["messages"] == [{"role": "user", "content": fake.requests[0]["messages"][0]["content"]}]
    step = seen[0]
    assert step.output_tokens == [3] and step.served.token_source == "chunks" and step.served.chunks == 3
    lat = res.collectors["latency"]
    assert lat["token_source"] == "chunks" and lat["output_tokens"] == 3


def test_malformed_events_and_slow_headers_fail_requests_not_the_run(tmp_path):
    def events(body: dict[str, Any]) -> list[tuple[float, str]]:
        if body["prompt"].startswith(bad_prompt[0]):
            return [(0.0, sse({"choices": [{"index": 0, "text": "a"}]})), (0.0, "data: {not json\n\n")]
        return completion_events(["a", "b"], usage=2)

    from perfsdk.models.prompts import load_examples

    bad_prompt = [load_examples("builtin:mixed", 4, 42)[1].prompt]
    fake = FakeServer(events)
    try:
        res = run_served(fake_config(fake.url, num_prompts=4, sort_by_length=False), tmp_path / "a")
    finally:
        fake.stop()
    lat = res.collectors["latency"]
    assert res.status == "partial"
    assert lat["errors"] >= 1 and lat["requests"] + lat["errors"] == 4
    assert lat["first_error"].startswith("malformed event")

    slow = FakeServer(lambda body: completion_events(["a"], usage=1), header_delay_s=2.0)
    cfg = fake_config(slow.url, num_prompts=2)
    cfg["model"]["request_timeout_s"] = 0.3
    try:
        res = run_served(cfg, tmp_path / "b")
    finally:
        slow.stop()
    lat = res.collectors["latency"]
    assert res.status == "partial" and lat["errors"] == 2 and lat["requests"] == 0
    assert lat["first_error"] == "timeout after 0.3 s"


def test_api_key_is_read_from_the_environment_and_never_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFSDK_TEST_KEY", "sekret-123")
    fake = FakeServer(lambda body: completion_events(["a"], usage=1), require_key="sekret-123")
    cfg = fake_config(fake.url, num_prompts=2)
    cfg["model"]["api_key_env"] = "PERFSDK_TEST_KEY"
    try:
        res = run_served(cfg, tmp_path)
    finally:
        fake.stop()
    assert res.status == "ok" and set(fake.auth) == {"Bearer sekret-123"}
    run_dir = tmp_path / "store" / "runs" / res.run_id
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"sekret-123" not in path.read_bytes(), path
    assert res.config["model"]["api_key_env"] == "PERFSDK_TEST_KEY"


def test_unset_key_variable_is_an_exit_2_error(tmp_path, perfsdk_cli, monkeypatch):
    monkeypatch.delenv("PERFSDK_NO_SUCH_KEY", raising=False)
    fake = FakeServer(lambda body: [])
    try:
        r = perfsdk_cli(["run", "--set", f"model.endpoint={fake.url}", "--set", "model.api_key_env=PERFSDK_NO_SUCH_KEY",
                         "--store", str(tmp_path / "s")])
    finally:
        fake.stop()
    assert r.exit_code == 2 and "model.api_key_env: the environment variable PERFSDK_NO_SUCH_KEY is not set" in r.output


def test_remote_endpoint_makes_host_counters_unavailable(tmp_path, monkeypatch):
    from perfsdk.backends.openai import OpenAIBackend

    fake = FakeServer(lambda body: completion_events(["a", "b"], usage=2))
    monkeypatch.setattr(OpenAIBackend, "is_local", lambda self: False)
    cfg = fake_config(fake.url, num_prompts=2)
    cfg["collectors"] = {"utilization": {}, "energy": {}}
    try:
        res = run_served(cfg, tmp_path)
    finally:
        fake.stop()
    assert "energy" in res.collectors, res.errors
    assert res.collectors["energy"]["status"] == "unavailable"
    assert res.collectors["energy"]["reasons"] == ["served model: endpoint on another host"]
    assert res.collectors["utilization"]["status"] == "unavailable"
    assert res.collectors["utilization"]["gpu_reason"] == "unavailable: endpoint on another host"
    assert json.dumps(res.config["model"]).count("endpoint") == 1
    assert os.environ.get("PERFSDK_TEST_KEY") is None


def test_server_metrics_deltas_and_peaks_from_prometheus(tmp_path):
    def metrics(n_requests: int) -> str:
        # a vLLM-style page: counters grow with the requests served, a gauge of the queue
        return "\n".join([
            "# HELP vllm:num_requests_running Number of requests running.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="m"}} {min(n_requests, 2)}.0',
            f'vllm:num_requests_waiting{{model_name="m"}} 0.0',
            f'vllm:gpu_cache_usage_perc{{model_name="m"}} {0.1 * n_requests}',
            f'vllm:num_preemptions_total{{model_name="m"}} {n_requests // 2}.0',
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {10 * n_requests}.0',
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {20 * n_requests}.0',
            f'vllm:generation_tokens_total{{model_name="m"}} {2 * n_requests}.0',
            'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3.0',
        ]) + "\n"

    fake = FakeServer(lambda body: completion_events(["a", "b"], usage=2), metrics=metrics)
    cfg = fake_config(fake.url, num_prompts=4)
    cfg["collectors"]["server_metrics"] = {"interval_s": 0}
    try:
        res = run_served(cfg, tmp_path)
    finally:
        fake.stop()
    sm = res.collectors["server_metrics"]
    assert sm["status"] == "ok" and sm["url"] == f"http://127.0.0.1:{fake.port}/metrics"
    # the 4 measured requests between the readings before and after them (the warm-up one left out)
    assert sm["deltas"] == {"preemptions": 2.0, "prefix_cache_hits": 40.0, "prefix_cache_queries": 80.0,
                            "generation_tokens": 8.0}
    # gauges as the server last showed them: 5 requests served by then, the warm-up one included
    assert sm["after"]["requests_running"] == 2.0 and sm["after"]["kv_cache_usage"] == pytest.approx(0.5)
    assert sm["raw_deltas"]["vllm:generation_tokens_total"] == 8.0
    assert sm["readings"] == 3  # at session start (is it there?), then before and after the requests

    plain = FakeServer(lambda body: completion_events(["a"], usage=1))
    cfg = fake_config(plain.url, num_prompts=1)
    cfg["collectors"]["server_metrics"] = {}
    try:
        res = run_served(cfg, tmp_path / "b")
    finally:
        plain.stop()
    sm = res.collectors["server_metrics"]
    assert sm["status"] == "unavailable" and sm["reason"] == f"unavailable: http://127.0.0.1:{plain.port}/metrics: Not Found"


def test_quality_on_a_served_model_scores_the_streamed_text(tmp_path):
    prompts = tmp_path / "qa.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"Is {i} even? Answer yes or no.",
                                             "label": "yes" if i % 2 == 0 else "no"}) for i in range(4)) + "\n")
    # the fake model always answers "yes": right on even numbers only
    fake = FakeServer(lambda body: completion_events([" yes"], usage=1))
    cfg = fake_config(fake.url, num_prompts=4, prompts=str(prompts), label_map=["yes", "no"])
    cfg["collectors"]["quality"] = {"metrics": ["accuracy"]}
    try:
        res = run_served(cfg, tmp_path)
    finally:
        fake.stop()
    q = res.collectors["quality"]
    assert q["accuracy"] == 0.5 and q["scored_requests"] == 4


# -- trace replay ---------------------------------------------------------------------------------


def test_replay_sends_each_request_at_its_trace_time(tmp_path, tiny_dir):
    trace = tmp_path / "trace.jsonl"
    rows = [(0.0, 12, 3), (0.05, 20, 2), (0.02, 7, 4), (0.1, 30, 1)]  # unsorted on purpose
    trace.write_text("".join(json.dumps({"time_s": t, "input_tokens": i, "output_tokens": o}) + "\n"
                             for t, i, o in rows))
    fake = FakeServer(lambda body: completion_events(["x"] * body["max_tokens"], usage=body["max_tokens"]))
    Steps, seen = steps_seen()

    cfg = fake_config(fake.url, load={"mode": "replay", "trace": str(trace), "time_scale": 2.0})
    cfg["model"]["tokenizer"] = str(tiny_dir)
    try:
        res = run_served(cfg, tmp_path, collectors=[Steps])
    finally:
        fake.stop()
    assert res.status == "ok", res.errors
    seen.sort(key=lambda s: s.served.scheduled_ns)
    t0 = seen[0].served.scheduled_ns
    # sorted by time, stretched by the time scale: 0, 40, 100, 200 ms
    assert [s.served.scheduled_ns - t0 for s in seen] == [0, 40_000_000, 100_000_000, 200_000_000]
    assert [s.output_tokens[0] for s in seen] == [3, 4, 2, 1]
    measured = fake.requests[1:]  # after the one warm-up request
    assert [b["max_tokens"] for b in measured] == [3, 4, 2, 1]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert [len(tok(b["prompt"], add_special_tokens=False)["input_ids"]) for b in measured] == [12, 7, 20, 30]
    assert res.collectors["latency"]["queue_s"]["count"] == 4


def test_bad_trace_rows_are_named(tmp_path, perfsdk_cli):
    fake = FakeServer(lambda body: [])
    bad = tmp_path / "trace.csv"
    bad.write_text("time_s,input_tokens,output_tokens\n0.0,10,5\n0.5,,5\n")
    bad2 = tmp_path / "trace.jsonl"
    bad2.write_text('{"time_s": 0, "input_tokens": 4, "output_tokens": 2}\n{"time_s": "soon", "input_tokens": 4, '
                    '"output_tokens": 2}\n')
    try:
        r = perfsdk_cli(["run", "--set", f"model.endpoint={fake.url}", "--set", "workload.load.mode=replay",
                         "--set", f"workload.load.trace={bad}", "--store", str(tmp_path / "s")])
        r2 = perfsdk_cli(["run", "--set", f"model.endpoint={fake.url}", "--set", "workload.load.mode=replay",
                          "--set", f"workload.load.trace={bad2}", "--store", str(tmp_path / "s")])
    finally:
        fake.stop()
    assert r.exit_code == 2 and f"workload.load.trace: {bad} row 3, field input_tokens: missing" in r.output
    assert r2.exit_code == 2 and f"{bad2} row 2, field time_s: 'soon' is not a number" in r2.output
    assert not fake.requests


# -- capacity: sweeps to saturation --------------------------------------------------------------------


def test_rate_sweep_stops_past_saturation_and_stores_every_point(tmp_path, perfsdk_cli):
    from perfsdk.experiments.sweep.manifest import read_manifest

    # a server with one slot of 10 ms per request: it holds 100 requests/s at most, and publishes
    # a vLLM-style gauge of its queue and a preemption counter
    fake = FakeServer(lambda body: completion_events(["a", "b"], usage=2, gap_s=0.0), serial_s=0.01,
                      metrics=lambda n: f"vllm:num_requests_waiting 0.0\nvllm:num_preemptions_total {n // 10}.0\n")
    store = tmp_path / "store"
    try:
        r = perfsdk_cli(["run", "--set", f"model.endpoint={fake.url}", "--set", "model.id=fake-model",
                         "--set", "workload.num_prompts=18", "--set", "workload.warmup_runs=0",
                         "--set", "workload.load={mode: sweep, max_rate_per_s: 100, steps: 5, arrival: constant, "
                                  "repeats: 1}",
                         "--set", "workload.slo={ttft_s: 0.5}", "--set", "collectors.utilization=false",
                         "--set", "collectors.server_metrics={interval_s: 0}",
                         "--set", "collectors.energy=false", "--store", str(store)])
    finally:
        fake.stop()
    assert r.exit_code == 0, r.output
    (sweep_file,) = (store / "sweeps").glob("*.json")
    m = read_manifest(str(store), sweep_file.stem)
    assert m["kind"] == "load" and m["status"] == "finished" and m["saturation_rate_per_s"] == 100
    levels = [p["level"] for p in m["points"]]
    assert levels == [10.0, 40.0, 70.0, 100.0, 130.0][:len(levels)]
    # stops by itself: the last point measured is the one whose queue grew, and none after it
    assert m["points"][-1]["diverged"] and m["points"][-1]["diverged"].startswith("latency diverges")
    assert all(p["diverged"] is None for p in m["points"][:-1])
    assert m["points"][-1]["level"] >= 100.0
    # every point (and the repeat of the SLO-limited rate) is a stored run tied to the sweep
    st = Store(store)
    runs = [st.get(rid) for rid in st.run_ids()]
    assert len(runs) == len(m["points"]) + len(m["repeats"]) == len(m["points"]) + 1
    assert {run.tags["sweep_id"] for run in runs} == {m["sweep_id"]}
    lim = m["slo_limit"]
    assert lim is not None and lim["level"] == m["points"][-2]["level"] and lim["measurements"] == 2
    assert "SLO-limited rate:" in r.output and "stopped: latency diverges" in r.output
    assert "offered/s" in r.output
    # `latest` names the sweep the most recent run belongs to: its report draws the curves
    rep = perfsdk_cli(["report", "latest", "--store", str(store), "--output", str(tmp_path / "sweep.html")])
    assert rep.exit_code == 0, rep.output
    pngs = sorted(p.name for p in (tmp_path / "sweep_files").iterdir())
    # the server's own view per point beside the client's
    assert pngs == ["01-load-latency.png", "02-load-goodput.png", "03-load-server.png"]
    assert all(st.get(p["run_id"]).collectors["server_metrics"]["status"] == "ok" for p in m["points"])
    page = (tmp_path / "sweep.html").read_text()
    assert f"({m['sweep_id']})" in page and "<h2>Load sweep</h2>" in page and "latency diverges" in page
    import subprocess

    from test_report_browser import CHROMIUM, FLAGS

    if CHROMIUM is not None:  # looked at in a real headless browser
        out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                              (tmp_path / "sweep.html").as_uri()], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0
        assert out.stdout.count('src="data:image/png;base64,') == 3 and "<h2>Load sweep</h2>" in out.stdout


def test_a_load_sweep_needs_a_served_model(tmp_path, perfsdk_cli):
    r = perfsdk_cli(["run", "--set", "workload.load.mode=sweep", "--store", str(tmp_path / "s")])
    assert r.exit_code == 2 and "workload.load.mode: sweep needs a served model (model.endpoint)" in r.output


def test_several_client_processes_share_one_schedule_and_clock(tmp_path):
    from perfsdk.backends.client_pool import processes_for
    from perfsdk.config import LoadConfig

    fake = FakeServer(lambda body: completion_events(["a", "b", "c"], usage=3, gap_s=0.001))
    Steps, seen = steps_seen()

    try:
        res = run_served(fake_config(fake.url, num_prompts=10, load={"mode": "rate", "rate_per_s": 50,
                                                                     "arrival": "constant", "client_processes": 2}),
                         tmp_path / "a", collectors=[Steps])
        assert res.status == "ok", res.errors
        sched = sorted(s.served.scheduled_ns for s in seen)
        assert len(sched) == 10 and all(b - a == 20_000_000 for a, b in zip(sched, sched[1:]))
        # every timestamp on the session's clock: sends after their schedule, tokens after the send
        assert all(s.start_ns >= s.served.scheduled_ns and s.token_times_ns[0] >= s.start_ns for s in seen)
        lat = res.collectors["latency"]
        assert lat["requests"] == 10 and lat["output_tokens"] == 30 and lat["client_send_lag_s"]["count"] == 10
        assert len(fake.requests) == 10 + 1  # and the one warm-up request, from this process
        closed = run_served(fake_config(fake.url, num_prompts=8, load={"mode": "concurrency", "concurrency": 4,
                                                                       "client_processes": 2}), tmp_path / "b")
        assert closed.collectors["latency"]["requests"] == 8 and closed.collectors["latency"]["concurrency_max"] <= 4
    finally:
        fake.stop()
    assert processes_for(LoadConfig(mode="rate", rate_per_s=100)) == 1
    assert processes_for(LoadConfig(mode="concurrency", concurrency=8, client_processes=3)) == 3


def test_client_processes_on_a_ray_cluster(tmp_path):
    """Client processes as Ray actors (a local Ray instance here): every time brought back to
    the session's clock, the alignment's uncertainty kept."""
    pytest.importorskip("ray", reason="the Ray client test needs ray: pip install -e '.[dev]'")
    from perfsdk.backends.client_pool import clock_offset

    # the offset estimate of a clock 5 ms ahead, read with no delay
    import time as _time

    off, unc = clock_offset(lambda: _time.perf_counter_ns() + 5_000_000)
    assert abs(off - 5_000_000) < 1_000_000 and unc >= 0
    fake = FakeServer(lambda body: completion_events(["a", "b"], usage=2, gap_s=0.001))
    Steps, seen = steps_seen()
    cfg = fake_config(fake.url, num_prompts=6, load={"mode": "rate", "rate_per_s": 30, "arrival": "constant",
                                                      "client_processes": 2, "client_executor": "ray"})
    try:
        res = run_served(cfg, tmp_path, collectors=[Steps])
    finally:
        fake.stop()
    assert res.status == "ok", res.errors
    assert res.collectors["latency"]["requests"] == 6 and res.collectors["latency"]["output_tokens"] == 12
    sched = sorted(s.served.scheduled_ns for s in seen)
    assert all(abs((b - a) - 33_333_333) <= 2 for a, b in zip(sched, sched[1:]))
    assert all(s.token_times_ns[0] >= s.start_ns - 1_000_000 for s in seen)


def test_concurrency_sweep_stops_when_throughput_saturates(tmp_path):
    from perfsdk.config import Config
    from perfsdk.experiments.load_sweep import LoadSweep

    # one slot of 50 ms: 20 requests/s whatever the number of users (long beside a request's own
    # client-side time, so that two users already fill it on a slow, busy host)
    fake = FakeServer(lambda body: completion_events(["a"], usage=1, gap_s=0.0), serial_s=0.05)
    cfg = Config(**fake_config(fake.url, num_prompts=12, load={"mode": "sweep", "sweep": "concurrency",
                                                                 "probe_concurrency": 4, "repeats": 0}))
    try:
        m = LoadSweep(cfg, str(tmp_path / "store")).run()
    finally:
        fake.stop()
    levels = [p["level"] for p in m["points"]]
    assert levels[:2] == [1.0, 2.0] and len(levels) < 5  # 1, 2, 4, 8, 16 users at most
    assert m["stopped"].startswith("throughput saturates") and m["points"][-1]["diverged"] == m["stopped"]
    assert all(p["achieved_rate_per_s"] <= 22 for p in m["points"])
