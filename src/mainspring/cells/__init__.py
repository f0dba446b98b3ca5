"""Cells: devices split into groups, each planned by a controller core of its own (placement from
demand, routing from each cell's load signal, and the controller's CPU cost in the simulator)."""
