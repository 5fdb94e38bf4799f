"""The echo function on Ray Serve, for ``bench/peers.py`` (run by the peers' virtualenv, which has Ray).

``python ray_echo.py PORT`` starts a local Ray (no dashboard, everything on 127.0.0.1), deploys one
replica of an echo deployment at ``/echo`` behind Serve's HTTP proxy on PORT, prints ``ready`` and
serves until stdin closes. ``RAY_SERVE_ENABLE_HA_PROXY=1`` in its environment selects Serve's HAProxy
mode instead of its default Python proxy.
"""

import sys

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(max_ongoing_requests=64)
class Echo:
    async def __call__(self, request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")


def main() -> None:
    port = int(sys.argv[1])
    ray.init(
        include_dashboard=False,
        num_cpus=2,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port}, grpc_options={"port": 0})
    serve.run(Echo.bind(), route_prefix="/echo", name="echo")
    print("ready", flush=True)
    sys.stdin.read()  # until the benchmark closes it
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
