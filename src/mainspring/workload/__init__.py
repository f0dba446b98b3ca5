"""Workloads: arrival processes and trace replay."""

from mainspring.workload.azure import AzureTrace
from mainspring.workload.base import Arrival, Workload
from mainspring.workload.compose import Composition, FixedRate, Part, ProgressiveActivation
from mainspring.workload.generators import BurstyOnOff, ClosedLoop, PoissonOpenLoop, SloSweep

__all__ = [
    "Arrival",
    "AzureTrace",
    "BurstyOnOff",
    "ClosedLoop",
    "Composition",
    "FixedRate",
    "Part",
    "PoissonOpenLoop",
    "ProgressiveActivation",
    "SloSweep",
    "Workload",
]
