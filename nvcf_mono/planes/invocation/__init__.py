"""The invocation plane."""
