"""What the agent takes from a cluster's NVCFBackend object."""

from __future__ import annotations

from nvcf_mono.planes.compute.backends.kubernetes.nvcf_backend import agent_status, settings_of
from nvcf_mono.planes.compute.config import GpuSettings


def test_an_empty_spec_leaves_the_configuration_as_it_is() -> None:
    found = settings_of({"metadata": {"name": "b"}, "spec": {}})
    assert (found.name, found.attributes, found.static_gpus, found.multi_node, found.helm) == (
        "b",
        None,
        None,
        None,
        True,
    )


def test_overrides_win_and_gates_turn_things_on_and_off() -> None:
    found = settings_of({
        "metadata": {"name": "b"},
        "spec": {
            "clusterConfig": {"attributes": ["HostIsolation"], "gpuDiscovery": {"dynamic": {}}},
            "featureGate": {"values": ["MultiNodeWorkloads", "-HelmMiniService", " "]},
            "overrides": {"clusterConfig": {"attributes": ["NVLinkOptimized=true"]}},
        },
    })  # fmt: skip
    assert found.attributes == ("NVLinkOptimized=true",)
    assert found.static_gpus is None and found.multi_node is True and found.helm is False


def test_static_discovery_reads_nvcas_gpu_config_and_skips_what_it_cannot_use() -> None:
    static = {"gpuConfig": [
        {"name": "L40S", "capacity": 8, "instanceTypes": [{"gpuCount": 1}, {"gpuCount": 4, "gpuMemory": "48GB"}]},
        {"name": "H100", "capacity": 0},
        {"capacity": 4},
        "junk",
    ]}  # fmt: skip
    found = settings_of({"spec": {"clusterConfig": {"gpuDiscovery": {"static": static}}}})
    assert found.static_gpus == (GpuSettings(name="L40S", count=4, nodes=2, memory="48GB"),)
    # Dynamic discovery turned off by its gate without a static inventory: the configured GPUs.
    assert settings_of({"spec": {"featureGate": {"values": ["-DynamicGPUDiscovery"]}}}).static_gpus == ()


def test_the_agents_status_names_when_its_state_changed() -> None:
    first = agent_status(healthy=True, kubernetes_version="v1.30.2", now="t1", changed=True)
    assert first == {"agentStatus": "Healthy", "lastUpdated": "t1", "kubernetesVersion": "v1.30.2",
                     "lastUpdatedAgentStatus": "t1"}  # fmt: skip
    assert "lastUpdatedAgentStatus" not in agent_status(healthy=True, kubernetes_version=None, now="t2", changed=False)
