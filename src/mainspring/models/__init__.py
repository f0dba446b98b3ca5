"""Models: profiles (and later the repository, the zoo and the profiler)."""
