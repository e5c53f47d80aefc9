"""Launchers: where a trial's command runs (this node, a Ray cluster, a Slurm allocation)."""

from __future__ import annotations

from tuner.runners.launchers.base import Job, Launcher, LaunchResult
from tuner.runners.launchers.local import LocalLauncher
from tuner.runners.launchers.ray import RayLauncher
from tuner.runners.launchers.slurm import SlurmLauncher

__all__ = ["Job", "LaunchResult", "Launcher", "LocalLauncher", "RayLauncher", "SlurmLauncher"]

LAUNCHERS = ("local", "ray", "slurm")
