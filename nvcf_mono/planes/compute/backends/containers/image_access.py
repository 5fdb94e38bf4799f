"""Which accounts may start an image the platform pulled onto the host.

An image pulled with one account's registry credentials stays in the engine's store; another account
naming it would otherwise start it without ever showing it can read it (``IfNotPresent`` finds it
present). So each pull is recorded: read anonymously, the image is anyone's; read with an account's
credentials, it is that account's, and another account's start first reads the image's manifest with
its own credentials (as Kubernetes' kubelet does for images a pull secret brought, with
``KubeletEnsureSecretPulledImages``). Images the platform did not pull (the operator's, or the
engine's own pulls) have no record and are anyone's.

Kept in one file of the backend's state directory, so a restarted agent still knows; at most
:data:`LIMIT` images, the least recently recorded forgotten first (a forgotten private image is then
the operator's to remove, or is read again with ``pull_policy: Always``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path

from nvcf_mono.state_dir import write_private

LIMIT = 10_000
#: Who may start an image: this for an image anyone may read.
ANYONE = "*"


class ImageAccess:
    """Image name on the host -> the accounts shown to read it (``ANYONE`` for a public one)."""

    def __init__(self, path: Path | None, log: logging.Logger) -> None:
        self._path = path
        self._log = log
        self._known: OrderedDict[str, frozenset[str]] = OrderedDict()
        if path is not None and path.exists():
            self._known.update(self._read(path))

    def _read(self, path: Path) -> dict[str, frozenset[str]]:
        try:
            data = json.loads(path.read_bytes())
            return {
                str(name): frozenset(map(str, accounts))
                for name, accounts in data.items()
                if isinstance(accounts, list) and accounts
            }
        except (OSError, ValueError, AttributeError) as err:
            # Unreadable: every record is lost, so private images already on the host become anyone's.
            self._log.warning("cannot read %s (%s): images pulled before are treated as the operator's", path, err)
            return {}

    def allows(self, name: str, account: str) -> bool:
        """Whether ``account`` may start ``name`` without showing it can read it."""
        accounts = self._known.get(name)
        return accounts is None or ANYONE in accounts or account in accounts

    def pulled(self, name: str, account: str | None) -> None:
        """``name`` was just pulled (its content may have changed): by ``account``'s credentials, or by
        none (None: anyone's).
        """
        self._set(name, frozenset({account or ANYONE}))

    def shown(self, name: str, account: str | None) -> None:
        """``account`` showed it can read ``name`` (None: it reads anonymously now: anyone's)."""
        self._set(name, self._known.get(name, frozenset()) | {account or ANYONE})

    def _set(self, name: str, accounts: frozenset[str]) -> None:
        self._known[name] = accounts
        self._known.move_to_end(name)
        while len(self._known) > LIMIT:
            self._known.popitem(last=False)
        if self._path is None:
            return
        data = {k: sorted(v) for k, v in self._known.items()}
        try:
            write_private(self._path, json.dumps(data).encode())
        except OSError as err:
            self._log.warning(
                "cannot write %s (%s): a restarted agent will not know who pulled %s", self._path, err, name
            )
