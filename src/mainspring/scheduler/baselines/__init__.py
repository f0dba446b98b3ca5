"""Reactive baselines for side-by-side comparison."""
