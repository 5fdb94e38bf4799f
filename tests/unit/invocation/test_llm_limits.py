"""The LLM gateway's request and token buckets, and the usage it reads from answers as they pass."""

from __future__ import annotations

import json

import pytest

from nvcf_mono.auth.principal import Principal
from nvcf_mono.planes.invocation.llm.errors import GatewayError
from nvcf_mono.planes.invocation.llm.limits import DEFAULT_MAX_TOKENS, Limits, duration, estimate_tokens
from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings
from nvcf_mono.planes.invocation.llm.usage import UsageMeter


def caller(account: str = "acct-a", key: str | None = "key-1") -> Principal:
    return Principal(kind="api_key", subject="u", account=account, scopes=frozenset(), key_id=key)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(limits: Limits, principal: Principal, estimate: int) -> GatewayError:
    with pytest.raises(GatewayError) as err:
        limits.admit(principal, estimate)
    assert err.value.status == 429
    return err.value


def test_requests_per_minute_refill_over_the_minute_and_say_when() -> None:
    clock = Clock()
    limits = Limits(LlmGatewaySettings(requests_per_minute=2), clock)
    limits.admit(caller(), 10)
    limits.admit(caller(), 10)
    err = refused(limits, caller(), 10)
    assert err.headers["Retry-After"] == "30"  # one request comes back every 30 s
    limits.admit(caller("acct-b"), 10)  # another account has its own bucket
    clock.now += 30
    limits.admit(caller(), 10)


def test_tokens_are_estimated_then_corrected_by_the_reported_usage() -> None:
    clock = Clock()
    limits = Limits(LlmGatewaySettings(tokens_per_minute=1000), clock)
    lease = limits.admit(caller(), 600)
    lease.settle(100)  # it used 100, not 600: 900 left
    limits.admit(caller(), 800).settle(800)
    refused(limits, caller(), 200)
    # A call that used more than estimated leaves the bucket in debt; it refills from there.
    clock.now += 60
    limits.admit(caller(), 10).settle(2000)
    err = refused(limits, caller(), 10)
    assert int(err.headers["Retry-After"]) > 60


def test_an_estimate_over_the_whole_limit_still_runs_when_the_bucket_is_full() -> None:
    limits = Limits(LlmGatewaySettings(tokens_per_minute=100), Clock())
    limits.admit(caller(), 10_000)
    refused(limits, caller(), 1)


def test_key_limits_apply_per_key_beside_the_accounts() -> None:
    limits = Limits(LlmGatewaySettings(key_requests_per_minute=1, requests_per_minute=3), Clock())
    limits.admit(caller(key="k1"), 1)
    refused(limits, caller(key="k1"), 1)
    limits.admit(caller(key="k2"), 1)
    limits.admit(caller(key=None), 1)  # a token without a key: the account's limit only
    err = refused(limits, caller(key=None), 1)
    assert "account" in str(err)


def test_a_refused_call_takes_nothing_from_the_buckets_that_had_room() -> None:
    limits = Limits(LlmGatewaySettings(key_requests_per_minute=1, requests_per_minute=2), Clock())
    limits.admit(caller(key="k1"), 1)
    refused(limits, caller(key="k1"), 1)  # the key is spent; the account's second request is not taken
    limits.admit(caller(key="k2"), 1)


def test_memory_follows_recent_callers() -> None:
    clock = Clock()
    limits = Limits(LlmGatewaySettings(requests_per_minute=5), clock)
    for i in range(3000):
        limits.admit(caller(f"acct-{i}"), 1)
        clock.now += 0.1  # each bucket is full again 12 s later
    assert len(limits._buckets) < 1200


def test_a_node_that_only_hears_of_callers_forgets_them_too() -> None:
    clock = Clock()
    limits = Limits(LlmGatewaySettings(requests_per_minute=5), clock)
    for i in range(3000):
        limits.take(("account", f"acct-{i}", "requests"), 1)  # another node's calls; none here
        clock.now += 0.1
    assert len(limits._buckets) < 1200


def test_estimates() -> None:
    assert estimate_tokens({"max_tokens": 50}, 400) == 150
    assert estimate_tokens({"max_completion_tokens": 7, "max_tokens": 50}, 4) == 8
    assert estimate_tokens({}, 0) == DEFAULT_MAX_TOKENS
    assert estimate_tokens({"max_tokens": "lots"}, 0) == DEFAULT_MAX_TOKENS


def sse(*docs: object) -> bytes:
    return b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("pieces", [1, 7, 64])
def test_usage_from_a_stream_cut_anywhere(pieces: int) -> None:
    body = sse({"choices": [{"delta": {"content": "a"}}]}, {"choices": [], "usage": {"total_tokens": 42}})
    meter = UsageMeter(streaming=True)
    step = max(1, len(body) // pieces)
    for i in range(0, len(body), step):
        meter.feed(body[i : i + step])
    assert meter.finish() == 42


def test_usage_of_json_answers_and_responses_events() -> None:
    meter = UsageMeter(streaming=False)
    meter.feed(b'{"usage": {"prompt_tokens": 3, ')
    meter.feed(b'"completion_tokens": 4}}')
    assert meter.finish() == 7
    stream = UsageMeter(streaming=True)
    stream.feed(
        b'event: response.completed\ndata: {"response": {"usage": {"input_tokens": 2, "output_tokens": 5}}}\n\n'
    )
    assert stream.finish() == 7


def test_answers_without_usage_or_not_json_leave_the_estimate() -> None:
    for streaming, body in ((False, b"not json"), (True, b"data: {broken\n\n"), (True, b"data: [DONE]\n\n")):
        meter = UsageMeter(streaming=streaming)
        meter.feed(body)
        assert meter.finish() is None


def test_an_endless_line_is_not_held() -> None:
    meter = UsageMeter(streaming=True)
    for _ in range(300):
        meter.feed(b"x" * 8192)
    assert len(meter._pending) <= 1024 * 1024 + 8192


def test_a_call_refused_before_it_ran_gives_its_tokens_back() -> None:
    limits = Limits(LlmGatewaySettings(tokens_per_minute=100), Clock())
    limits.admit(caller(), 90).settle(0)  # what the gateway does when the invocation is refused
    limits.admit(caller(), 90)  # the bucket is whole again


def test_nodes_take_what_the_others_report_so_a_caller_meets_one_limit() -> None:
    clock = Clock()
    settings = LlmGatewaySettings(requests_per_minute=4, tokens_per_minute=1000, key_requests_per_minute=3)
    a, b = Limits(settings, clock), Limits(settings, clock)
    a.sharing = b.sharing = True
    a.admit(caller(), 100).settle(300)  # estimated 100, used 300
    a.admit(caller(), 100)
    report = a.taken()
    assert report == {
        ("account", "acct-a", "requests"): 2,
        ("account", "acct-a", "tokens"): 400,
        ("key", "key-1", "requests"): 2,
    }
    assert a.taken() == {}  # reported once
    for key, amount in report.items():
        b.take(key, amount)
    b.admit(caller(), 100)
    err = refused(b, caller(), 1)  # the key's 3 a minute: two on a, one here
    assert "on this key: limit 3;" in err.message
    b.admit(caller(key="key-2"), 100)  # the account's fourth request
    refused(b, caller(key="key-3"), 1)
    assert refused(b, caller(key="key-3"), 400).message.startswith("Rate limit reached for requests")


def test_what_a_call_gives_back_is_given_back_on_every_node() -> None:
    settings = LlmGatewaySettings(tokens_per_minute=1000)
    a, b = Limits(settings, Clock()), Limits(settings, Clock())
    a.sharing = True
    lease = a.admit(caller(), 800)
    for key, amount in a.taken().items():
        b.take(key, amount)
    refused(b, caller(), 300)
    lease.settle(0)  # refused downstream before it ran: nothing spent
    for key, amount in a.taken().items():
        b.take(key, amount)
    b.admit(caller(), 300)


def test_a_node_alone_keeps_nothing_to_report() -> None:
    limits = Limits(LlmGatewaySettings(requests_per_minute=5, tokens_per_minute=100), Clock())
    for i in range(50):
        limits.admit(caller(f"acct-{i}"), 10).settle(20)
    assert limits.taken() == {}
    assert not Limits(LlmGatewaySettings(), Clock()).limited and limits.limited


def test_reports_from_unknown_buckets_or_of_limits_not_set_are_ignored() -> None:
    limits = Limits(LlmGatewaySettings(requests_per_minute=2), Clock())
    limits.take(("account", "acct-a", "tokens"), 10**9)  # no token limit here
    limits.take(("key", "key-1", "requests"), 10**9)  # nor a key limit
    limits.admit(caller(), 10**6)
    limits.take(("account", "acct-a", "requests"), 1)
    refused(limits, caller(), 1)


def test_answers_carry_openais_rate_limit_headers_for_the_tightest_bucket() -> None:
    clock = Clock()
    limits = Limits(
        LlmGatewaySettings(requests_per_minute=10, key_requests_per_minute=4, tokens_per_minute=1000), clock
    )
    lease = limits.admit(caller(), 100)
    assert lease.headers == {
        "x-ratelimit-limit-requests": "4",  # the key's 4 a minute are tighter than the account's 10
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "15s",  # one request refills in a quarter of the minute
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6s",
    }
    for _ in range(3):
        limits.admit(caller(), 100)
    err = refused(limits, caller(), 100)
    assert err.headers["x-ratelimit-remaining-requests"] == "0" and err.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert Limits(LlmGatewaySettings(), clock).admit(caller(), 1).headers == {}  # no limits, no headers


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0ms"), (0.0004, "1ms"), (0.25, "250ms"), (12, "12s"), (1.5, "1.5s"), (90, "1m30s"), (360, "6m0s")],
)
def test_waits_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
