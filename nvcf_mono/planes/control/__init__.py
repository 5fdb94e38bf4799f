"""The control plane."""
