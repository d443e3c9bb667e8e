"""Prompt sources with their verifiers: every source yields `Task`s and scores completions."""

from spectool.data.sources import Task, TaskSource, load_source

__all__ = ["Task", "TaskSource", "load_source"]
