"""The test NATS cluster starts on new ports when one it chose was taken before a node could bind it."""

from __future__ import annotations

import socket

import pytest

from nvcf_mono.testing.nats_server import NatsCluster


def _route_port(cluster: NatsCluster, index: int) -> int:
    args = cluster.nodes[index]._extra
    return int(args[args.index("--cluster") + 1].rsplit(":", 1)[1])


@pytest.mark.slow
def test_a_route_port_taken_in_between_makes_the_cluster_start_on_new_ports() -> None:
    cluster = NatsCluster()
    taken = _route_port(cluster, 1)
    with socket.socket() as squatter:  # another test's server, say, bound it after it was chosen
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            cluster.start()
            assert all(node.proc is not None and node.proc.poll() is None for node in cluster.nodes)
            assert taken not in {_route_port(cluster, i) for i in range(len(cluster.nodes))}
        finally:
            cluster.close()
    assert all(node.proc is None for node in cluster.nodes)


def test_a_cluster_that_cannot_start_is_closed_before_the_error() -> None:
    cluster = NatsCluster()
    squatters = []
    for i in range(len(cluster.nodes)):
        sock = socket.socket()
        sock.bind(("127.0.0.1", _route_port(cluster, i)))
        sock.listen()
        squatters.append(sock)
    try:
        with pytest.raises(RuntimeError):
            cluster.start(attempts=1)
    finally:
        for sock in squatters:
            sock.close()
    assert all(node.proc is None for node in cluster.nodes)  # nothing left running
