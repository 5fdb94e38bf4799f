"""The compute plane."""
