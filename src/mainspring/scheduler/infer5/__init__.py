"""Clockwork's INFER5 scheduler (``policy.py``)."""

from mainspring.scheduler.infer5.policy import Infer5Scheduler

__all__ = ["Infer5Scheduler"]
