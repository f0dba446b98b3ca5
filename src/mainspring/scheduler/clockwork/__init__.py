"""The Clockwork policy: predict every duration, plan ahead, reject early."""

from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.policy import ClockworkScheduler

__all__ = ["ClockworkConfig", "ClockworkScheduler"]
