"""The controller loop around a scheduler."""

from mainspring.controller.controller import Controller, ControllerObserver, WorkerLink

__all__ = ["Controller", "ControllerObserver", "WorkerLink"]
