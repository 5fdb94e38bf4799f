"""The MiniService extensions of the agent's plugins, applied to Helm installs (``nvcf_mono.miniservice_extensions``).

Their kinds are applied under the plural they name, their mutations run after the built-in admission
(and the object is put back in the install's namespace whatever they did), and their health verdicts
join the built-in rules' failures and waits.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence

import attrs

from nvcf_mono.miniservice_extensions import Install, MiniServiceExtension, chart_types
from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes import miniservice
from nvcf_mono.planes.compute.backends.kubernetes.api import Obj
from nvcf_mono.reval.objects import ExtraType


class ExtensionFailed(Exception):
    """An extension's mutation raised or returned something that is not an object."""


@attrs.frozen
class Verdicts:
    """The extensions' objections to one look at an install, in words."""

    failures: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


class Extensions:
    """Every extension the agent's plugins contributed, in plugin order."""

    def __init__(self, extensions: Iterable[MiniServiceExtension], log: logging.Logger) -> None:
        self._all = tuple(extensions)
        self._log = log
        self._plurals = {(k.group, k.version, k.kind): k.plural for e in self._all for k in e.kinds}
        #: Kinds of installed objects to read for the extensions' health rules.
        self.health_kinds = frozenset(kind for e in self._all for kind in e.health_kinds)
        #: What the chart validator allows besides the built-in kinds.
        self.chart_types: tuple[ExtraType, ...] = chart_types(self._all)

    def install(self, spec: LaunchSpec, namespace: str, flags: Mapping[str, bool]) -> Install:
        msg = spec.message
        function = msg.function_details
        return Install(
            namespace=namespace,
            cluster_id=spec.cluster_id,
            instance_id=spec.instance_id,
            nca_id=msg.nca_id,
            function_id=function.function_id if function else None,
            function_version_id=function.function_version_id if function else None,
            task_id=msg.task_details.task_id if msg.task_details else None,
            instance_type=msg.instance_type_name,
            feature_flags=dict(flags),
        )

    def resource_of(self, obj: Obj) -> tuple[str, str, str]:
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        plural = self._plurals.get((group, version, str(obj.get("kind", ""))))
        return (group, version, plural) if plural else miniservice.resource_of(obj)

    def mutate(self, obj: Obj, install: Install) -> Obj:
        """The object after every extension's mutation, still in the install's namespace."""
        for extension in self._all:
            try:
                changed = extension.mutate(copy.deepcopy(obj), install)
            except Exception as err:
                raise ExtensionFailed(f"MiniService extension {extension.name}: {err}") from err
            meta = changed.get("metadata") if isinstance(changed, dict) else None
            if not isinstance(meta, dict) or not meta.get("name"):
                raise ExtensionFailed(f"MiniService extension {extension.name} returned no named object")
            changed["metadata"]["namespace"] = install.namespace  # an extension never moves an object out
            obj = changed
        return obj

    def verdicts(self, objects: Sequence[Obj], install: Install) -> Verdicts:
        if not self._all:
            return Verdicts()
        failures: list[str] = []
        waiting: list[str] = []
        for obj in objects:
            what = f"{obj.get('kind', 'Pod')}/{obj.get('metadata', {}).get('name', '?')}"
            for extension in self._all:
                try:
                    verdict = extension.health(obj, install)
                except Exception:
                    self._log.exception("MiniService extension %s: health rule failed on %s", extension.name, what)
                    continue
                if verdict is None or verdict.state == "ready":
                    continue
                text = f"{what}: {verdict.detail or verdict.state} ({extension.name})"
                (failures if verdict.state == "failed" else waiting).append(text)
        return Verdicts(failures=tuple(failures), waiting=tuple(waiting))
