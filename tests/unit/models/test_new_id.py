"""Ids are random version-4 UUIDs in their canonical text, whatever the random bytes."""

from __future__ import annotations

import uuid

from nvcf_mono.models.common import is_uuid, new_id


def test_every_id_is_a_canonical_random_uuid() -> None:
    ids = [new_id() for _ in range(5000)]
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and is_uuid(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert len(set(ids)) == len(ids)
    # Every hex digit outside the fixed version and variant bits varies.
    positions = [i for i, ch in enumerate(ids[0]) if ch != "-" and i not in (14,)]
    assert all(len({text[i] for text in ids}) > 1 for i in positions)
