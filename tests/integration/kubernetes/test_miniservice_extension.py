"""The MiniService extension point, through the example plugin (examples/miniservice-extension) installed
from its own package into a directory of its own and found by its entry point.

With it enabled, a chart with a PodDisruptionBudget (not a built-in kind) is accepted by the control
plane's validator and applied by the agent under the extension's plural; every object carries the
extension's label and every pod template its annotation; the instance waits until the budget is
satisfied and fails at once when its server is OOMKilled, with the extension's words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.testing.platform import deployment, wait_for, wait_status
from tests.e2e.cli import ROOT
from tests.function_charts import INFERENCE, SERVICE, write_chart
from tests.integration.compute.conftest import create, deploy, spec
from tests.integration.kubernetes.conftest import (
    Cluster,
    ended,
    ready_status,
    registered,
    stamp,
    validate,
)
from tests.integration.kubernetes.test_helm_functions import (
    CLUSTER,
    helm_function,
    helm_platform,
    installed,
    pod_from,
    worker_pod,
)
from tests.support.packages import install_package

pytestmark = [pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "miniservice-extension"
PDB = """\
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: inference-pdb
spec:
  minAvailable: 1
  selector:
    matchLabels: {app: inference}
"""


async def ms_status(kc: Cluster) -> dict[str, Any]:
    (obj,) = kc.objects("nvca.nvcf.nvidia.io/v1alpha1/miniservices", None).values()
    return dict(obj.get("status") or {})


async def test_an_installed_extension_adds_a_kind_a_mutation_and_health_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    install_package(EXAMPLE, site)
    monkeypatch.syspath_prepend(str(site))  # where its entry point is found, as in a user's virtualenv
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE, "p.yaml": PDB})
    async with helm_platform(tmp_path, **{"plugins.disruption_budgets.enabled": "true"}) as (kc, p):
        await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
        _, _, d = await create(p.admin, helm_function(chart))  # the validator takes the extension's kind
        await deploy(p.admin, d, spec("H100"))

        ns, pdb = await installed(kc, "poddisruptionbudgets", "inference-pdb")
        assert pdb["metadata"]["labels"]["example.com/team"] == "nvcf-default"
        validate(pdb)
        _, inference = await installed(kc, "deployments", "inference")
        template = inference["spec"]["template"]
        assert template["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        assert inference["metadata"]["labels"]["example.com/team"] == "nvcf-default"
        assert inference["metadata"]["namespace"] == ns
        validate(inference)

        # Every pod ready, but the budget has no status yet: the instance waits, and says why.
        await kc.create_pod(pod_from(inference, ns, "inference-abc12"))
        worker = worker_pod(kc, ns)
        for name in (worker, "inference-abc12"):
            await kc.set_pod_status(name, ready_status(), namespace=ns)

        async def waiting_on_budget() -> bool:
            status = await ms_status(kc)
            conditions = " ".join(c.get("message", "") for c in status.get("conditions") or ())
            return status.get("phase") == "Starting" and "pods the budget asks for" in conditions

        await wait_for(waiting_on_budget, timeout=20, what="the MiniService waiting on the budget")
        assert (await deployment(p.admin, d))["functionStatus"] == "DEPLOYING"

        # The disruption controller's part: the budget is met, and the instance serves.
        await kc._request(
            "PATCH",
            f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/inference-pdb/status",
            {"status": {"currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 1}},
            "application/merge-patch+json",
        )
        await wait_status(p.admin, d, "ACTIVE")

        # The server is OOMKilled once: the extension fails the instance without waiting for a restart loop.
        oom = ready_status()
        oom["containerStatuses"][0].update(
            restartCount=1,
            lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": stamp(1)}},
        )
        await kc.set_pod_status("inference-abc12", oom, namespace=ns)
        view = await ended(p, CLUSTER, worker, "failed")
        log = view.instance.error_log or ""
        assert "ObjectsFailed" in log and "OOMKilled" in log and "(disruption_budgets)" in log, log
