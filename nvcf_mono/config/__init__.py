"""Configuration: attrs-frozen settings from YAML files, the environment and command-line flags.

``config.model`` holds the settings, ``config.load`` reads them. The package itself imports neither, so a
process that only needs a settings class (a worker configuring its logging) does not load YAML, the plugin
registry and the rest of the loader.
"""
