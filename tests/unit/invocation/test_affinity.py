"""The conversation -> instance table behind session affinity: per version, expiring, bounded, shared."""

from __future__ import annotations

from nvcf_mono.contracts.frames import Headers, Request
from nvcf_mono.planes.invocation import affinity
from nvcf_mono.planes.invocation.affinity import Affinity, Place, session_key


def request(headers: Headers, *, account: str = "acct-a") -> Request:
    return Request(
        request_id="r",
        nca_id=account,
        function_id="f",
        function_version_id="v",
        method="POST",
        path="/",
        headers=headers,
        reply="x",
        time_ms=0,
        deadline_ms=0,
        poll_seconds=0,
    )


def test_a_conversation_is_named_by_its_header_in_any_case_within_its_callers_account() -> None:
    assert session_key(request((("Content-Type", "a"), ("X-Multi-Turn-Session-Id", " conv-1 ")))) == "acct-a/conv-1"
    assert session_key(request((("x-multi-turn-session-id", ""),))) is None
    assert session_key(request((("x-multi-turn-session-id", "x" * 300),))) is None  # not an id worth keeping
    assert session_key(request(())) is None
    # A shared function's callers from two accounts with one session id: two conversations.
    same = (("x-multi-turn-session-id", "conv-1"),)
    assert session_key(request(same, account="acct-a")) != session_key(request(same, account="acct-b"))


def test_the_last_instance_of_a_conversation_per_version_until_it_expires() -> None:
    now = [0.0]
    table = Affinity(clock=lambda: now[0], node="here")
    table.took("v1", "conv", "i1")
    table.took("v2", "conv", "i9")  # the same key on another version is another conversation
    assert table.place_of("v1", "conv") == Place("i1", "here") and table.place_of("v2", "conv") == Place("i9", "here")
    table.took("v1", "conv", "i2")
    assert table.place_of("v1", "conv") == Place("i2", "here")
    now[0] = affinity.TTL + 1
    assert table.place_of("v1", "conv") is None and len(table) == 1  # forgotten once looked up


def test_the_table_keeps_the_most_recent_conversations_only() -> None:
    table = Affinity()
    for i in range(affinity.MAX_SESSIONS + 10):
        table.took("v", f"c{i}", "i")
    assert len(table) == affinity.MAX_SESSIONS
    assert table.place_of("v", "c0") is None
    assert table.place_of("v", f"c{affinity.MAX_SESSIONS + 9}") == Place("i", table.node)


def test_the_other_nodes_are_told_when_a_conversation_is_new_moves_or_was_told_long_ago() -> None:
    now = [0.0]
    table = Affinity(clock=lambda: now[0], node="here")
    assert table.took("v", "conv", "i1")  # new
    now[0] = 1.0
    assert not table.took("v", "conv", "i1")  # the same instance again: nothing new
    assert table.took("v", "conv", "i2")  # moved
    now[0] = 1.0 + affinity.REANNOUNCE - 0.5
    assert not table.took("v", "conv", "i2")  # turns keep it alive here, but not the others' entries...
    now[0] = 1.0 + affinity.REANNOUNCE
    assert table.took("v", "conv", "i2")  # ...so they are told again before theirs expire
    assert affinity.REANNOUNCE < affinity.TTL


def test_what_another_node_says_is_kept_and_what_names_this_node_is_not() -> None:
    now = [0.0]
    table = Affinity(clock=lambda: now[0], node="here")
    table.heard("v", "conv", Place("i7", "there"))
    assert table.place_of("v", "conv") == Place("i7", "there")
    table.heard("v", "conv", Place("i8", "here"))  # an echo of this node's own: it knows better
    assert table.place_of("v", "conv") == Place("i7", "there")
    assert table.took("v", "conv", "i1")  # served here after all: the others must hear it moved
    assert table.place_of("v", "conv") == Place("i1", "here")
    table.forget("v", "conv")  # its instance did not answer a handover
    assert table.place_of("v", "conv") is None
    table.forget("v", "never")
    assert Affinity().node != Affinity().node  # one name per process, even with one configured node id


def test_one_off_calls_the_gateway_named_cannot_push_out_the_conversations_that_go_on() -> None:
    """The gateway names every chat that names no conversation; most are never continued. Their first
    turns are kept apart, and a second turn moves a conversation into the main table."""
    table = Affinity(node="here")
    table.took("v", "acct/chat-1", "i1")  # a caller's own conversation
    table.took("v", f"acct/{affinity.MINTED}kept", "i2")
    table.took("v", f"acct/{affinity.MINTED}kept", "i2")  # sent back: it goes on
    for i in range(affinity.MAX_SESSIONS + 10):
        table.took("v", f"acct/{affinity.MINTED}{i}", "i3")
    assert table.place_of("v", "acct/chat-1") == Place("i1", "here")
    assert table.place_of("v", f"acct/{affinity.MINTED}kept") == Place("i2", "here")
    assert table.place_of("v", f"acct/{affinity.MINTED}0") is None  # the oldest one-off went
    assert table.place_of("v", f"acct/{affinity.MINTED}{affinity.MAX_SESSIONS + 9}") == Place("i3", "here")
    assert len(table) == affinity.MAX_SESSIONS + 2
    # Heard from another node, the same: a first turn apart, a later one in the main table.
    table.heard("v", f"acct/{affinity.MINTED}far", Place("i4", "there"))
    assert table.place_of("v", f"acct/{affinity.MINTED}far") == Place("i4", "there")
    table.forget("v", f"acct/{affinity.MINTED}far")
    assert table.place_of("v", f"acct/{affinity.MINTED}far") is None
