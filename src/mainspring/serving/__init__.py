"""The serving topology: configuration, the controller node and its frontends, local child processes
kept running, cells (local or on Ray) and the placement of workers on Ray."""
