"""Clockwork's INFER4 scheduler as published: the reference the ``clockwork`` policy is measured against."""

from mainspring.scheduler.infer4.policy import Infer4Scheduler

__all__ = ["Infer4Scheduler"]
