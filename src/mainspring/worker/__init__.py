"""Workers: executors, page pool and runtimes."""
