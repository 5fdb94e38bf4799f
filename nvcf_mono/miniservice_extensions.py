"""The MiniService extension point: what a plugin adds to Helm installs on the Kubernetes backend.

A Helm function or task is installed as a MiniService: a namespace of its own, the worker's pod, and
the chart's objects as NVCA's admission webhook would admit them. Contribute a
:class:`MiniServiceExtension` to :data:`MINISERVICE_EXTENSIONS` in a plugin's ``setup()`` to

- allow **object kinds** charts may contain besides the built-in list (``kinds``): the control plane's
  chart validator accepts them and the agent applies them (enable the plugin on control and compute
  nodes);
- **mutate** every chart object after the built-in admission (``mutate``): labels, annotations,
  scheduling, sidecars. The object stays in the install's namespace whatever the mutation does;
- add **health rules** (``health``): a verdict on each of the install's pods and on the installed
  objects of the kinds in ``health_kinds``, read every few looks. ``failed`` fails the instance
  (``ObjectsFailed``) and ``waiting`` keeps it from serving, as the built-in rules do; with the chart's
  ``StatusByWorkerReadiness`` flag they are shown, not acted on. ``None``: no opinion.

Extensions are asked in plugin start order. A ``mutate`` that raises fails the install (the detail
names the extension); a ``health`` that raises is logged and counts as no opinion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from nvcf_mono.reval.objects import ExtraType
from nvcf_mono.services import ExtensionPoint

Manifest = dict[str, Any]


@attrs.frozen
class ObjectKind:
    """A kind charts may contain: ``api_version`` as in the object (``policy/v1``), its ``kind`` and the
    resource's plural (``poddisruptionbudgets``) the Kubernetes API serves it under.
    """

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


@attrs.frozen(kw_only=True)
class Install:
    """The install an extension is asked about."""

    namespace: str
    cluster_id: str
    instance_id: str
    #: The account that owns the function or task.
    nca_id: str
    function_id: str | None
    function_version_id: str | None
    task_id: str | None
    instance_type: str
    #: The chart's workload feature flags (``nvcf-workload-config``).
    feature_flags: Mapping[str, bool] = attrs.field(factory=dict)


@attrs.frozen
class ObjectHealth:
    """A health rule's verdict on one object; ``detail`` is shown in the instance's status and log."""

    state: Literal["ready", "waiting", "failed"]
    detail: str = ""


class MiniServiceExtension:
    """Override what the extension adds; the defaults add nothing. One object serves every install."""

    #: Named in failures and logs.
    name: str = "extension"
    #: Kinds charts may contain besides the built-in ones.
    kinds: tuple[ObjectKind, ...] = ()
    #: Kinds (``Kind`` names) of installed objects read for :meth:`health`; pods are always given.
    health_kinds: tuple[str, ...] = ()

    def mutate(self, obj: Manifest, install: Install) -> Manifest:
        """The object to apply: ``obj`` (a copy, already admitted) changed, or a new one."""
        return obj

    def health(self, obj: Manifest, install: Install) -> ObjectHealth | None:
        """A verdict on one pod or object of the install (its current state from the API), or None."""
        return None


MINISERVICE_EXTENSIONS: ExtensionPoint[MiniServiceExtension] = ExtensionPoint("nvcf_mono.miniservice.extensions")


def chart_types(extensions: Iterable[MiniServiceExtension]) -> tuple[ExtraType, ...]:
    """The kinds the extensions allow, as the chart validator takes them."""
    return tuple(
        ExtraType(group=k.group, version=k.version, kind=k.kind, resource=k.plural)
        for extension in extensions
        for k in extension.kinds
    )
