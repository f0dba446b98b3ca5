"""``python -m mainspring.cli``: the ``mainspring`` command, as child processes and benchmarks start it."""

from mainspring.cli.commands import main

raise SystemExit(main())
