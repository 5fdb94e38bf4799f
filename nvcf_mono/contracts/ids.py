"""The ids the API takes in a path, for its server and its clients alike.

Runs of letters, digits, '-' and '_' joined by single dots, so that any id composes into valid KV
keys and subject tokens. The server answers 400 to a path with anything else (never a lookup), and
the CLI refuses one before sending: an id from a command line with a space, '?', '#' or '..' in it
would otherwise make another URL, or none.
"""

from __future__ import annotations

import re

ID_PATTERN = r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$"
ID_MAX_LENGTH = 256
#: What an id may be, as error messages say it.
ID_RULE = f"ids have at most {ID_MAX_LENGTH} letters, digits, '-', '_' and single '.'"
_ID_RX = re.compile(ID_PATTERN)


def is_id(value: str) -> bool:
    """Whether ``value`` can be a path's id (every fixed segment of the API's paths is one too)."""
    return len(value) <= ID_MAX_LENGTH and _ID_RX.match(value) is not None


def shown(value: str) -> str:
    """``value`` cut short for an error message."""
    return value if len(value) <= 64 else value[:64] + "..."
