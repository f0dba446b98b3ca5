"""Runtimes that execute actions: emulated (simulator) and, later, torch."""
