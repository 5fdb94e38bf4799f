"""The conversation -> instance table behind session affinity: per version, expiring, bounded."""

from __future__ import annotations

from nvcf_mono.planes.invocation import affinity
from nvcf_mono.planes.invocation.affinity import Affinity, session_key


def test_a_conversation_is_named_by_its_header_in_any_case_and_nothing_else() -> None:
    assert session_key((("Content-Type", "a"), ("X-Multi-Turn-Session-Id", " conv-1 "))) == "conv-1"
    assert session_key((("x-multi-turn-session-id", ""),)) is None
    assert session_key((("x-multi-turn-session-id", "x" * 300),)) is None  # not an id worth keeping
    assert session_key(()) is None


def test_the_last_instance_of_a_conversation_per_version_until_it_expires() -> None:
    now = [0.0]
    table = Affinity(clock=lambda: now[0])
    table.took("v1", "conv", "i1")
    table.took("v2", "conv", "i9")  # the same key on another version is another conversation
    assert table.instance_of("v1", "conv") == "i1" and table.instance_of("v2", "conv") == "i9"
    table.took("v1", "conv", "i2")
    assert table.instance_of("v1", "conv") == "i2"
    now[0] = affinity.TTL + 1
    assert table.instance_of("v1", "conv") is None and len(table) == 1  # forgotten once looked up


def test_the_table_keeps_the_most_recent_conversations_only() -> None:
    table = Affinity()
    for i in range(affinity.MAX_SESSIONS + 10):
        table.took("v", f"c{i}", "i")
    assert len(table) == affinity.MAX_SESSIONS
    assert table.instance_of("v", "c0") is None and table.instance_of("v", f"c{affinity.MAX_SESSIONS + 9}") == "i"
