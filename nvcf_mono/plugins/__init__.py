"""Built-in plugins that are not planes (auth strategies, renderers, ...), one module or package each."""
