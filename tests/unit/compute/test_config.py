"""The compute plugin's settings and cluster identities."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvcf_mono.config.load import ConfigError, ConfigSources, load_config
from nvcf_mono.planes.compute.config import ClusterSettings, ComputeConfig
from nvcf_mono.planes.compute.identity import cluster_ids


def _load(**sets: str) -> ComputeConfig:
    overrides = tuple((k, v, f"--set {k}") for k, v in sets.items())
    config = load_config(ConfigSources(overrides=overrides))
    return config.plugins["compute"].config  # type: ignore[no-any-return]


def test_defaults_are_one_local_cluster_with_eight_h100() -> None:
    config = _load()
    (local,) = config.clusters
    assert local.name == "local" and local.gpu_discovery == "auto"
    assert [(g.name, g.count, g.nodes) for g in local.gpus] == [("H100", 8, 1)]


def test_clusters_and_images_are_checked_with_their_paths() -> None:
    with pytest.raises(ConfigError) as err:
        _load(
            **{
                "plugins.compute.clusters": json.dumps(
                    [
                        {"name": "a", "gpus": [{"name": "H100"}, {"name": "h100"}]},
                        {"name": "a", "backend": "Bad Name"},
                    ]
                ),
                "images.echo.port": "high",
            }
        )
    issues = [str(i) for i in err.value.issues]
    assert any(i.startswith("plugins.compute.clusters.1.backend: ") and "backend name" in i for i in issues), issues
    assert any("images.echo.port: expected an integer" in i for i in issues), issues
    with pytest.raises(ConfigError, match="cluster name 'a' is used twice"):
        _load(**{"plugins.compute.clusters": json.dumps([{"name": "a"}, {"name": "a"}])})
    with pytest.raises(ConfigError, match="GPU H100 is listed twice"):
        _load(**{"plugins.compute.clusters": json.dumps([{"name": "a", "gpus": [{"name": "H100"}, {"name": "h100"}]}])})


def test_cluster_ids_are_generated_once_and_kept(tmp_path: Path) -> None:
    clusters = (ClusterSettings(name="a"), ClusterSettings(name="b", id="fixed-id"))
    first = cluster_ids(tmp_path, clusters)
    assert first["b"] == "fixed-id" and first["a"] != "fixed-id"
    assert cluster_ids(tmp_path, clusters) == first
    assert cluster_ids(tmp_path, (ClusterSettings(name="c"), ClusterSettings(name="a")))["a"] == first["a"]
    assert (tmp_path / "clusters.json").stat().st_mode & 0o777 == 0o600
