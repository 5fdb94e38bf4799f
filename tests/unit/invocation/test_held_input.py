"""One account's input held in a node's memory: counted per request, bounded per account, given back."""

from __future__ import annotations

import pytest

from nvcf_mono.contracts import live_input as wire
from nvcf_mono.grpc.raw import pack
from nvcf_mono.planes.invocation.held_input import CALLS_SETTING, SETTING, HeldInput, TooMuchHeld
from nvcf_mono.planes.invocation.live_input import LiveInput


def test_an_account_is_held_to_its_limit_and_others_are_not() -> None:
    held = HeldInput(limit=100)
    first, second = held.hold("acme"), held.hold("acme")
    first.take(60)
    with pytest.raises(TooMuchHeld) as refused:
        second.take(41)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    assert SETTING in refused.value.detail and "60 bytes" in refused.value.detail
    assert held.held("acme") == 60 and second.size == 0  # a refusal counts nothing
    second.take(40)
    with held.hold("neighbour") as theirs:
        theirs.take(100)  # another account's calls have a limit of their own
    assert held.held("neighbour") == 0
    first.give(30)
    second.take(30)
    assert held.held("acme") == 100


def test_what_a_request_held_is_given_back_when_it_ends_and_nothing_is_remembered() -> None:
    held = HeldInput(limit=1000)
    for n in range(10_000):
        with held.hold(f"account-{n}") as hold:
            hold.take(10)
            hold.give(25)  # more than it holds: only what it holds
            hold.take(10)
        assert held.held(f"account-{n}") == 0
    assert held.accounts() == 0  # grows with the calls in flight, not with history


def test_no_limit_counts_without_refusing() -> None:
    held = HeldInput(limit=0)
    with held.hold("acme") as hold:
        hold.take(1 << 40)
        assert held.held("acme") == 1 << 40
    assert held.accounts() == 0


async def test_a_live_call_gives_back_what_its_function_read_once_answered() -> None:
    held = HeldInput(limit=1 << 20)
    hold = held.hold("acme")
    live = LiveInput(limit=1 << 20, hold=hold)
    a, b = pack([b"a" * 100]), pack([b"b" * 100])
    for message in (a, b):
        hold.take(len(message))  # what the proxy's guard counts as each message is read
        await live.append(message)
    assert await live.read(len(a)) == wire.DATA + b
    assert held.held("acme") == len(a + b)  # kept whole until the answer starts: a redelivery reads it all
    live.answered()
    assert await live.read(len(a + b), hold=0.01) == wire.WAIT
    assert held.held("acme") == 0  # read and let go
    hold.close()
    assert held.accounts() == 0


def test_an_account_has_at_most_so_many_calls_in_flight_on_a_node() -> None:
    held = HeldInput(limit=0, calls=2)
    first, second = held.hold("acme"), held.hold("acme")
    with pytest.raises(TooMuchHeld) as refused:
        held.hold("acme")
    assert refused.value.status == 429 and CALLS_SETTING in refused.value.detail
    assert "2 calls in flight" in refused.value.detail and refused.value.headers == {"Retry-After": "1"}
    held.hold("neighbour").close()  # another account's calls count on their own
    first.close()
    first.close()  # closed twice, counted once
    assert held.calls("acme") == 1
    third = held.hold("acme")
    second.close()
    third.close()
    assert held.accounts() == 0
