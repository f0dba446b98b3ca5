"""``mainspring bench``: open-loop load against any KServe v2 server (Mainspring, Triton, ...)."""
