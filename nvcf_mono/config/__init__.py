"""Configuration: attrs-frozen settings from YAML files, the environment and command-line flags."""

from nvcf_mono.config.load import ConfigError, ConfigSources, PluginEntry, ResolvedConfig, load_config
from nvcf_mono.config.model import Settings

__all__ = ["ConfigError", "ConfigSources", "PluginEntry", "ResolvedConfig", "Settings", "load_config"]
