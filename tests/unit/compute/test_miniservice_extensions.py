"""MiniService extensions as the agent applies them: order, containment in the namespace, failures."""

from __future__ import annotations

import logging

import pytest

from nvcf_mono.miniservice_extensions import Install, Manifest, MiniServiceExtension, ObjectHealth, ObjectKind
from nvcf_mono.planes.compute.backends.kubernetes.extensions import ExtensionFailed, Extensions

INSTALL = Install(
    namespace="sr-abc",
    cluster_id="c",
    instance_id="0-sr-abc",
    nca_id="acct",
    function_id="f",
    function_version_id="v",
    task_id=None,
    instance_type="ON-PREM.GPU.H100_1x",
)


class Labeller(MiniServiceExtension):
    name = "labeller"
    kinds = (ObjectKind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),)

    def mutate(self, obj: Manifest, install: Install) -> Manifest:
        obj["metadata"].setdefault("labels", {})["seen"] = obj["metadata"].get("labels", {}).get("seen", "") + "a"
        obj["metadata"]["namespace"] = "kube-system"  # tries to move it out
        return obj


class Second(MiniServiceExtension):
    name = "second"

    def mutate(self, obj: Manifest, install: Install) -> Manifest:
        obj["metadata"]["labels"]["seen"] += "b"
        return obj

    def health(self, obj: Manifest, install: Install) -> ObjectHealth | None:
        if obj.get("kind") == "NetworkPolicy":
            raise RuntimeError("bug in a rule")
        return ObjectHealth("failed", "no") if obj["metadata"]["name"] == "bad" else None


class Broken(MiniServiceExtension):
    name = "broken"

    def mutate(self, obj: Manifest, install: Install) -> Manifest:
        raise ValueError("cannot")


def test_mutations_run_in_order_and_never_move_an_object_out_of_its_namespace() -> None:
    ext = Extensions([Labeller(), Second()], logging.getLogger("t"))
    original = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "sr-abc"}}
    out = ext.mutate(original, INSTALL)
    assert out["metadata"] == {"name": "c", "namespace": "sr-abc", "labels": {"seen": "ab"}}
    assert "labels" not in original["metadata"]  # each extension works on a copy
    assert ext.resource_of({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"}) == (
        "networking.k8s.io", "v1", "networkpolicies",
    )  # fmt: skip
    assert [(t.group, t.kind) for t in ext.chart_types] == [("networking.k8s.io", "NetworkPolicy")]


def test_a_mutation_that_raises_fails_the_install_naming_the_extension() -> None:
    ext = Extensions([Broken()], logging.getLogger("t"))
    with pytest.raises(ExtensionFailed, match="MiniService extension broken: cannot"):
        ext.mutate({"kind": "ConfigMap", "metadata": {"name": "c"}}, INSTALL)


def test_verdicts_name_the_object_and_extension_and_a_raising_rule_has_no_opinion() -> None:
    ext = Extensions([Second()], logging.getLogger("t"))
    verdicts = ext.verdicts(
        [{"kind": "Pod", "metadata": {"name": "bad"}}, {"kind": "NetworkPolicy", "metadata": {"name": "np"}}], INSTALL
    )
    assert verdicts.failures == ("Pod/bad: no (second)",) and verdicts.waiting == ()
