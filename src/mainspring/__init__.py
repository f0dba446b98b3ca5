"""Mainspring: predictable DNN model serving, after Clockwork (OSDI 2020)."""

__version__ = "0.1.0"
