"""A ``requests`` session that connects only where :mod:`nvcf_mono.contracts.egress` allows, for the
OpenTelemetry exporters that send a tenant's telemetry (imported only where OpenTelemetry is).

Every connection is checked, redirects included: the name is resolved here and only an allowed address
is dialled (TLS still verifies the name). Proxy variables are ignored, so no proxy connects for us
unless the operator names one: then each request goes through it, after the checks
:func:`~nvcf_mono.contracts.egress.proxied_refusal` can make before the proxy resolves the name itself.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import create_connection

from nvcf_mono.contracts.egress import EgressRefused, Network, connectable, proxied_refusal
from nvcf_mono.tracing import Credentials


class _Checked(HTTPConnection):
    allowed: ClassVar[tuple[Network, ...]] = ()

    def _new_conn(self) -> socket.socket:
        try:
            addresses = connectable(self._dns_host, self.port, self.allowed)
        except socket.gaierror as err:
            raise NameResolutionError(self.host, self, err) from err
        except EgressRefused as err:
            raise NewConnectionError(self, f"Failed to establish a new connection: refused: {err.strerror}") from err
        failure: OSError | None = None
        for ip in addresses:
            try:
                return create_connection(
                    (ip, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as err:
                raise ConnectTimeoutError(self, f"Connection to {self.host} timed out") from err
            except OSError as err:
                failure = err
        raise NewConnectionError(self, f"Failed to establish a new connection: {failure}") from failure


class _CheckedTLS(_Checked, HTTPSConnection):
    pass


class _Adapter(HTTPAdapter):
    def __init__(
        self, allowed: tuple[Network, ...], proxy: str | None = None, credentials: Credentials | None = None
    ) -> None:
        self._allowed = allowed
        self._proxy = proxy
        self._credentials = credentials
        attrs = {"allowed": allowed}
        self._pools = {
            "http": type(
                "CheckedPool", (HTTPConnectionPool,), {"ConnectionCls": type("CheckedConnection", (_Checked,), attrs)}
            ),
            "https": type(
                "CheckedTLSPool",
                (HTTPSConnectionPool,),
                {"ConnectionCls": type("CheckedTLSConnection", (_CheckedTLS,), attrs)},
            ),
        }
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pools

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        if self._credentials is not None and self._credentials.belong(request.url or ""):
            # Last, over what the exporter was made with: a secret replaced since applies at once.
            request.headers.update(self._credentials.current())
        if self._proxy is not None:
            # The proxy dials the destination, not our connection classes: check what can be checked here.
            host = urlsplit(request.url or "").hostname or ""
            why = proxied_refusal(host, self._allowed)
            if why is not None:
                raise requests.ConnectionError(f"refused: {why}", request=request)
            kwargs["proxies"] = {"http": self._proxy, "https": self._proxy}
        return super().send(request, *args, **kwargs)


def checked_session(
    allowed: Sequence[Network], proxy: str | None = None, *, credentials: Credentials | None = None
) -> requests.Session:
    """A session whose connections go only to public addresses and to ``allowed``; through ``proxy`` (the
    operator's) when given; sending the current ``credentials`` with every request.
    """
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: it would connect where we do not check
    adapter = _Adapter(tuple(allowed), proxy, credentials)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
