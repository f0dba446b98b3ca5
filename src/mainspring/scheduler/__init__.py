"""Scheduling policies behind one contract."""

from mainspring.scheduler.base import Decisions, Scheduler

__all__ = ["Decisions", "Scheduler"]
