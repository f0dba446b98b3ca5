"""The ``mainspring`` command: a module per command (or family of commands) that parses its flags and
hands them to the library."""

from mainspring.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
