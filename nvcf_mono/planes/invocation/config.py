"""Settings of the invocation plane (``plugins.invocation``)."""

from __future__ import annotations

from typing import Literal

import attrs

from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings
from nvcf_mono.structure import ByteSize, Seconds, at_least, in_range, positive, setting


@attrs.frozen(kw_only=True)
class InvocationConfig:
    """Settings of the invocation plane."""

    default_poll_seconds: int = setting(
        60, doc="How long a request waits for its response head before the client gets a 202.", check=in_range(1, 3600)
    )
    streaming_poll_seconds: int = setting(
        1200, doc="The same for clients that accept text/event-stream.", check=in_range(1, 3600)
    )
    max_poll_seconds: int = setting(3600, doc="Largest NVCF-POLL-SECONDS accepted.", check=in_range(1, 3600))
    queue_deadline: Seconds = setting(
        3600.0,
        doc="A request no instance has started by then is dropped with a stored 504 result.",
        check=positive,
    )
    grpc_live_after: Seconds = setting(
        0.05,
        doc="A gRPC call whose client has not closed its side within this is started with the messages it sent so "
        "far, and its later messages reach the function while it answers (full duplex: a client waiting for an "
        "answer before it sends more is served); one that closes within it (unary and server-streaming calls at "
        "once) is stored whole first. 0: every call starts at once.",
        check=at_least(0),
    )
    result_ttl: Seconds = setting(3600.0, doc="How long the result of a 202'd request is kept.", check=positive)
    inline_body_limit: ByteSize = setting(
        4 * 1024 * 1024,
        doc="Request bodies up to this size travel in the request message, larger ones in the object store; "
        "never more than half the message bus's max_payload.",
        check=in_range(1024, 4 * 1024 * 1024),
    )
    max_request_body: ByteSize = setting(
        64 * 1024 * 1024,
        doc="Largest request body an invocation accepts (pexec, exec, Host-routed calls, the gRPC proxy); larger "
        "ones are refused with 413 before anything is stored. Larger inputs go to functions as assets.",
        check=positive,
    )
    frame_size: ByteSize = setting(
        256 * 1024, doc="Largest body piece in one response frame.", check=in_range(1024, 4 * 1024 * 1024)
    )
    relay_window: int = setting(
        16, doc="Response frames a relay may send before the receiver acknowledges them.", check=in_range(1, 1024)
    )
    queue_max_messages: int = setting(
        100_000, doc="Requests one version's queue holds; more are refused with 429.", check=positive
    )
    queue_max_bytes: ByteSize = setting(
        1024**3,
        doc="Bytes one version's queue holds; more are refused with 429. Enforced by the invocation nodes "
        "(JetStream would reserve it per version out of the whole store): several nodes together may overshoot "
        "it by what each accepts in a quarter of a second.",
        check=positive,
    )
    account_queue_max_bytes: ByteSize = setting(
        2 * 1024**3,
        doc="Bytes the queues of one account's functions hold together; more are refused with 429, so one "
        "account cannot fill the store every account's requests wait in. 0: no account limit. Enforced like "
        "queue_max_bytes.",
        check=at_least(0),
    )
    account_held_input_max_bytes: ByteSize = setting(
        1024**3,
        doc="Bytes of request input one account's calls may hold in an invocation node's memory together (HTTP "
        "bodies up to inline_body_limit, LLM gateway bodies, gRPC calls' messages until stored or, when live, "
        "read by the function); a call past it is refused with 429 (gRPC: RESOURCE_EXHAUSTED) before those bytes "
        "are read. Per node. 0: no account limit.",
        check=at_least(0),
    )
    account_calls_in_flight_max: int = setting(
        10_000,
        doc="Calls of one account an invocation node serves at once (pexec, exec, Host-routed, LLM gateway and "
        "gRPC calls until answered or 202'd, status polls while they wait); more are refused with 429 (gRPC: "
        "RESOURCE_EXHAUSTED). Per node. 0: no account limit.",
        check=at_least(0),
    )
    publish_patience: Seconds = setting(
        15.0,
        doc="How long storing a request may wait for the bus (a NATS node lost: its streams elect new leaders) "
        "before the caller gets 503 with Retry-After; the request id keeps a retried store from counting twice "
        "(the queue remembers each id for twice this long).",
        check=positive,
    )
    ack_wait: Seconds = setting(
        30.0, doc="A delivery not confirmed in progress for this long is redelivered.", check=positive
    )
    max_deliver: int = setting(
        3,
        doc="Deliveries before a request that keeps failing its instance gets a 500 answer instead of "
        "another instance (a few more are allowed for deliveries that failed unseen: a killed worker).",
        check=in_range(1, 100),
    )
    keepalive: Seconds = setting(
        10.0, doc="How often an instance's in-progress requests are kept alive.", check=positive
    )
    session_ttl: Seconds = setting(3 * 3600.0, doc="Lifetime of a worker session token.", check=positive)
    transport: Literal["grpc", "nats"] = setting(
        "grpc",
        doc="How requests reach workers: pushed down the WorkerService stream (grpc), or pulled by the workers "
        "from NATS with credentials scoped to their version (nats; needs the nats_auth plugin's auth callout). "
        "Workers that cannot use the chosen one fall back to grpc.",
    )
    max_large_response: ByteSize = setting(
        1024 * 1024 * 1024,
        doc="Largest zipped large response (a function's output files with its body) this plane keeps; a larger "
        "one is refused and the caller gets a 500 problem saying so.",
        check=positive,
    )
    public_url: str | None = setting(
        None,
        doc="The URL callers reach this plane's API at, for the links it hands out (a large response's download "
        "link). Default: this node's own URL.",
    )
    worker_nats_url: str | None = setting(
        None,
        doc="NATS URL workers on the nats transport connect to. Default: this node's NATS URL without credentials.",
    )
    idempotency_ttl: Seconds = setting(
        24 * 3600.0, doc="How long an Idempotency-Key keeps naming its request.", check=positive
    )
    rate_limit_flush: Seconds = setting(
        0.05, doc="How often local rate-limit counts are shared with the other invocation nodes.", check=positive
    )
    rate_limit_timeout: Seconds = setting(
        0.05, doc="A rate-limit check the bus does not answer in time lets the request through.", check=positive
    )
    sweep_interval: Seconds = setting(
        5.0,
        doc="How often the request queues of versions no longer deployed are looked for: their waiting requests "
        "are answered 404 and the queues removed.",
        check=at_least(0.1),
    )
    retired_queue_grace: Seconds = setting(
        30.0,
        doc="How long a version's queue outlives its deployment before it is emptied and removed (requests "
        "another node accepted just before it heard of the undeploy are in it by then).",
        check=at_least(0),
    )
    load_report_interval: Seconds = setting(
        1.0,
        doc="How often workers report their load to this node, and this node reports it to the autoscaler.",
        check=in_range(0.05, 60),
    )
    llm_gateway: LlmGatewaySettings = setting(
        factory=LlmGatewaySettings, doc="The OpenAI-compatible gateway (/v1/chat/completions, ...) on the HTTP port."
    )
