"""The autoscaler's inputs: the load book built from invocation nodes' reports, and each version's policy."""

from __future__ import annotations

import math
import time
from typing import Any

from nvcf_mono.contracts.load import InstanceLoad, LoadReport, VersionLoad
from nvcf_mono.models.deployment import GpuSpec
from nvcf_mono.planes.control.autoscale.algorithm import Policy, Stickiness
from nvcf_mono.planes.control.autoscale.observations import LoadBook
from nvcf_mono.planes.control.autoscale.policy import platform_policy, version_policy
from nvcf_mono.planes.control.config import AutoscalerSettings
from nvcf_mono.structure import structure

FID = "fn-1"
FVID = "fv-1"


def _report(
    busy: float,
    slots: float,
    *,
    fvid: str = FVID,
    invocations: int = 0,
    instances: tuple[InstanceLoad, ...] = (),
    node: str = "node-a",
) -> LoadReport:
    return LoadReport(
        node=node,
        at=time.time(),
        interval=1.0,
        versions=(
            VersionLoad(
                function_id=FID,
                function_version_id=fvid,
                busy_seconds=busy,
                slot_seconds=slots,
                invocations=invocations,
                instances=instances,
            ),
        ),
    )


def _inst(iid: str, in_flight: int = 0, slots: int = 4, ready: bool = True) -> InstanceLoad:
    return InstanceLoad(instance_id=iid, in_flight=in_flight, slots=slots, ready=ready)


# --- LoadBook.samples ------------------------------------------------------------------------------


def test_fully_busy_interval_is_100_percent() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(40.0, 40.0), now=100.0)
    assert book.version(FVID).samples(100.0, step=60.0, lookback=0.0, window=70.0) == [100.0]


def test_half_busy_interval_is_50_percent() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(10.0, 40.0), now=100.0)
    book.record(_report(30.0, 40.0), now=110.0)
    # (10 + 30) / (40 + 40) over the window.
    assert book.version(FVID).samples(110.0, step=60.0, lookback=0.0, window=70.0) == [50.0]


def test_window_without_report_has_no_point() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(40.0, 40.0), now=100.0)
    book.record(_report(0.0, 40.0), now=300.0)
    # Sample ends at 180, 240 and 300 (window 50): only the one at 300 sees a report.
    assert book.version(FVID).samples(300.0, step=60.0, lookback=120.0, window=50.0) == [0.0]


def test_version_never_reported_has_no_samples() -> None:
    book = LoadBook(keep=1000.0)
    assert book.version("other").samples(100.0, step=60.0, lookback=600.0, window=70.0) == []


def test_report_without_slot_time_but_with_instances_is_nan() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(0.0, 0.0, instances=(_inst("i-1", ready=False),)), now=100.0)
    [point] = book.version(FVID).samples(100.0, step=60.0, lookback=0.0, window=70.0)
    assert math.isnan(point)


def test_report_with_nothing_at_all_adds_no_interval() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(0.0, 0.0), now=100.0)
    assert book.version(FVID).samples(100.0, step=60.0, lookback=0.0, window=70.0) == []


def test_samples_are_oldest_first() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(10.0, 40.0), now=100.0)  # 25 %
    book.record(_report(20.0, 40.0), now=160.0)  # 50 %
    book.record(_report(40.0, 40.0), now=220.0)  # 100 %
    samples = book.version(FVID).samples(220.0, step=60.0, lookback=120.0, window=30.0)
    assert samples == [25.0, 50.0, 100.0]


def test_sample_window_is_open_at_its_start_and_closed_at_its_end() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(40.0, 40.0), now=100.0)
    vb = book.version(FVID)
    assert vb.samples(100.0, step=60.0, lookback=0.0, window=10.0) == [100.0]
    assert vb.samples(110.0, step=60.0, lookback=0.0, window=10.0) == []  # 100 is not in (100, 110]
    assert vb.samples(99.0, step=60.0, lookback=0.0, window=10.0) == []  # not yet received


def test_versions_are_kept_apart() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(40.0, 40.0, fvid="a"), now=100.0)
    book.record(_report(0.0, 40.0, fvid="b"), now=100.0)
    assert book.version("a").samples(100.0, step=60.0, lookback=0.0, window=70.0) == [100.0]
    assert book.version("b").samples(100.0, step=60.0, lookback=0.0, window=70.0) == [0.0]


# --- LoadBook: forgetting, invocations, workers -----------------------------------------------------


def test_reports_older_than_keep_are_forgotten() -> None:
    book = LoadBook(keep=100.0)
    book.record(_report(40.0, 40.0, instances=(_inst("old"),)), now=100.0)
    book.record(_report(0.0, 40.0, instances=(_inst("new"),)), now=250.0)
    vb = book.version(FVID)
    assert [at for at, _, _ in vb.intervals] == [250.0]
    assert set(vb.workers) == {"new"}
    # Even with a window wide enough to cover it, the old report no longer counts.
    assert vb.samples(250.0, step=60.0, lookback=0.0, window=1000.0) == [0.0]


def test_reports_within_keep_are_kept() -> None:
    book = LoadBook(keep=100.0)
    book.record(_report(40.0, 40.0), now=100.0)
    book.record(_report(0.0, 40.0), now=200.0)  # exactly keep later: still kept
    assert [at for at, _, _ in book.version(FVID).intervals] == [100.0, 200.0]


def test_invocations_set_last_invoked() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(0.0, 0.0), now=100.0)
    assert book.version(FVID).last_invoked is None
    book.record(_report(0.0, 0.0, invocations=3), now=150.0)
    assert book.version(FVID).last_invoked == 150.0
    book.record(_report(5.0, 40.0), now=200.0)  # no invocations: unchanged
    assert book.version(FVID).last_invoked == 150.0


def test_wake_sets_last_invoked() -> None:
    book = LoadBook(keep=1000.0)
    book.invoked(FVID, 42.0)
    assert book.version(FVID).last_invoked == 42.0


def test_connected_drops_workers_not_reported_recently() -> None:
    book = LoadBook(keep=1000.0)
    book.record(_report(0.0, 4.0, instances=(_inst("i-old", in_flight=1),)), now=100.0)
    book.record(_report(0.0, 4.0, instances=(_inst("i-new", in_flight=2),)), now=108.0)
    vb = book.version(FVID)
    connected = vb.connected(110.0, fresh=5.0)
    assert set(connected) == {"i-new"}
    assert connected["i-new"].in_flight == 2
    assert connected["i-new"].slots == 4
    assert connected["i-new"].seen == 108.0
    assert set(vb.connected(110.0, fresh=10.0)) == {"i-old", "i-new"}


def test_busy_lists_instances_with_requests_in_flight() -> None:
    book = LoadBook(keep=1000.0)
    now = time.monotonic()
    book.record(
        _report(1.0, 8.0, instances=(_inst("i-busy", in_flight=3), _inst("i-idle", in_flight=0))),
        now=now,
    )
    assert book.busy(FVID, fresh=60.0) == frozenset({"i-busy"})
    assert book.busy("unknown", fresh=60.0) == frozenset()


def test_busy_ignores_stale_workers() -> None:
    book = LoadBook(keep=1000.0)
    now = time.monotonic()
    book.record(_report(1.0, 8.0, instances=(_inst("i-stale", in_flight=3),)), now=now - 30.0)
    book.record(_report(1.0, 8.0, instances=(_inst("i-fresh", in_flight=1),)), now=now)
    assert book.busy(FVID, fresh=10.0) == frozenset({"i-fresh"})


# --- version_policy ------------------------------------------------------------------------------------


def _spec(**extra: Any) -> GpuSpec:
    spec: GpuSpec = structure(
        GpuSpec,
        {"gpu": "L40S", "instanceType": "gl40s_1.br25_2xlarge", "minInstances": 0, "maxInstances": 4, **extra},
    )
    return spec


_CUSTOM = {
    "scaleUpDetails": {
        "factor": 2.0,
        "threshold": 60,
        "stickiness": {"size": "PT3M", "threshold": "PT2M"},
    },
    "scaleDownDetails": {"factor": 0.5, "threshold": 20},
}


def test_no_configuration_is_the_platform_policy() -> None:
    cfg = AutoscalerSettings()
    policy = version_policy([_spec()], cfg)
    assert policy == platform_policy(cfg)
    assert policy == Policy(
        scale_up_threshold=70.0, scale_down_threshold=30.0, scale_up_factor=1.2, scale_down_factor=0.8
    )
    assert policy.scale_up_stickiness is None
    assert policy.scale_down_stickiness is None


def test_no_specs_is_the_platform_policy() -> None:
    cfg = AutoscalerSettings()
    assert version_policy([], cfg) == platform_policy(cfg)


def test_platform_policy_follows_settings() -> None:
    cfg = AutoscalerSettings(scale_up_threshold=80.0, scale_down_threshold=10.0, scale_up_factor=1.5)
    assert version_policy([_spec()], cfg) == Policy(
        scale_up_threshold=80.0, scale_down_threshold=10.0, scale_up_factor=1.5, scale_down_factor=0.8
    )


def test_custom_configuration_with_stickiness_in_samples() -> None:
    cfg = AutoscalerSettings(sample_step=60.0)
    policy = version_policy([_spec(autoscalingConfiguration=_CUSTOM)], cfg)
    assert policy == Policy(
        scale_up_threshold=60.0,
        scale_down_threshold=20.0,
        scale_up_factor=2.0,
        scale_down_factor=0.5,
        scale_up_stickiness=Stickiness(3, 2),
        scale_down_stickiness=None,
    )


def test_custom_configuration_policy_is_used_when_named() -> None:
    cfg = AutoscalerSettings(sample_step=60.0)
    spec = _spec(autoscalingConfiguration=_CUSTOM, autoscalingConfigurationPolicy="CUSTOM_CONFIGURATION")
    assert version_policy([spec], cfg).scale_up_stickiness == Stickiness(3, 2)


def test_stickiness_scales_with_sample_step() -> None:
    cfg = AutoscalerSettings(sample_step=30.0)
    policy = version_policy([_spec(autoscalingConfiguration=_CUSTOM)], cfg)
    assert policy.scale_up_stickiness == Stickiness(6, 4)


def test_stickiness_shorter_than_a_step_is_dropped() -> None:
    conf = {
        **_CUSTOM,
        "scaleUpDetails": {"factor": 2.0, "threshold": 60, "stickiness": {"size": "PT30S", "threshold": "PT30S"}},
    }
    policy = version_policy([_spec(autoscalingConfiguration=conf)], AutoscalerSettings(sample_step=60.0))
    assert policy.scale_up_threshold == 60.0
    assert policy.scale_up_stickiness is None


def test_platform_configuration_policy_ignores_the_configuration() -> None:
    cfg = AutoscalerSettings()
    spec = _spec(autoscalingConfiguration=_CUSTOM, autoscalingConfigurationPolicy="PLATFORM_CONFIGURATION")
    assert version_policy([spec], cfg) == platform_policy(cfg)


def test_invalid_configuration_falls_back_to_the_platform_policy() -> None:
    cfg = AutoscalerSettings()
    for up_threshold in (20, 10):  # equal to, then below, the down threshold
        conf = {
            "scaleUpDetails": {"factor": 2.0, "threshold": up_threshold},
            "scaleDownDetails": {"factor": 0.5, "threshold": 20},
        }
        assert version_policy([_spec(autoscalingConfiguration=conf)], cfg) == platform_policy(cfg)


def test_bad_factors_fall_back_to_the_platform_policy() -> None:
    cfg = AutoscalerSettings()
    for up_factor, down_factor in ((1.0, 0.5), (2.0, 1.0), (2.0, 0.0)):
        conf = {
            "scaleUpDetails": {"factor": up_factor, "threshold": 60},
            "scaleDownDetails": {"factor": down_factor, "threshold": 20},
        }
        assert version_policy([_spec(autoscalingConfiguration=conf)], cfg) == platform_policy(cfg)


def test_incomplete_configuration_falls_back_to_the_platform_policy() -> None:
    cfg = AutoscalerSettings()
    conf = {"scaleUpDetails": {"factor": 2.0, "threshold": 60}}
    assert version_policy([_spec(autoscalingConfiguration=conf)], cfg) == platform_policy(cfg)


def test_first_spec_with_valid_configuration_wins() -> None:
    cfg = AutoscalerSettings()
    other = {
        "scaleUpDetails": {"factor": 3.0, "threshold": 90},
        "scaleDownDetails": {"factor": 0.25, "threshold": 5},
    }
    specs = [_spec(), _spec(autoscalingConfiguration=_CUSTOM), _spec(autoscalingConfiguration=other)]
    assert version_policy(specs, cfg).scale_up_threshold == 60.0
