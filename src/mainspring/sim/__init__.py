"""Discrete-event simulation of a cluster of emulated devices."""
