"""A function for tests that looks around its host as a hostile tenant's would:
``python -m nvcf_mono.testing.snoop_server --port P``.

``POST /snoop`` with ``{"paths": [...]}`` answers what this process could read: ``read`` (path ->
the first 4 KiB), ``denied`` (path -> the error), ``workers`` (pid -> ``"read"`` or the error) for
every ``nvcf-mono worker`` process on the machine (their command lines are public, their
environments hold tokens), and ``me`` (uid, gid, groups, HOME, the secrets file's path). At start
it leaves a daemon behind in a session of its own (``daemon.pid`` in its working directory), as a
function that wants to outlive its instance would. ``/health`` answers 200.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from aiohttp import web

PROC = Path("/proc")


def _read(path: str) -> tuple[str | None, str | None]:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode(errors="replace"), None
    except OSError as err:
        return None, f"{type(err).__name__}: {err}"


def _workers() -> dict[str, str]:
    """``pid -> "read" | error`` for every nvcf-mono worker process (read: its environment was readable)."""
    out = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"nvcf_mono" not in argv or b"worker" not in argv:
            continue
        _, error = _read(str(entry / "environ"))
        out[entry.name] = error or "read"
    return out


async def snoop(request: web.Request) -> web.Response:
    doc = await request.json()
    read, denied = {}, {}
    for path in doc.get("paths", []):
        text, error = _read(path)
        if error is None:
            read[path] = text
        else:
            denied[path] = error
    me = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "home": os.environ.get("HOME"),  # noqa: TID251 - what the instance was given
        "secrets": os.environ.get("SECRETS_FILE"),  # noqa: TID251
    }
    return web.json_response({"read": read, "denied": denied, "workers": _workers(), "me": me})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def leave_a_daemon() -> None:
    """A process in a session of its own, which a process-group kill does not reach."""
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    Path("daemon.pid").write_text(str(daemon.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    leave_a_daemon()
    application = web.Application()
    application.router.add_post("/snoop", snoop)
    application.router.add_get("/health", health)
    web.run_app(application, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
