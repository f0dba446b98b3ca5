"""Telemetry: request and action logs, run reports, plots."""
