"""A function of your own, in one file with no dependencies: ``python server.py --port 8000``.

``POST /infer`` with ``{"text": "hello"}`` answers ``{"upper": "HELLO", "length": 5}``; ``GET /health``
answers 200 once the server listens. The platform tells each instance its port with ``--port {port}``
(see my-images.yaml) and in ``INFERENCE_PORT``/``PORT``; it sends the request id in ``NVCF-REQID``.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    """The function's two routes."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self.answer(200, {"status": "OK"})
        else:
            self.answer(404, {"detail": f"no route {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/infer":
            self.answer(404, {"detail": f"no route {self.path}"})
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            text = json.loads(raw or b"{}").get("text", "")
        except (ValueError, AttributeError):
            self.answer(400, {"detail": 'send a JSON object such as {"text": "hello"}'})
            return
        if not isinstance(text, str):
            self.answer(400, {"detail": "'text' must be a string"})
            return
        self.answer(200, {"upper": text.upper(), "length": len(text), "reqid": self.headers.get("NVCF-REQID")})

    def answer(self, status: int, doc: dict[str, object]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the platform keeps each instance's output in its log."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = int(os.environ.get("INFERENCE_PORT") or os.environ.get("PORT") or 8000)  # noqa: TID251
    parser.add_argument("--port", type=int, default=default)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
