"""Transports: one interface for running steps on this machine or on every TPU worker over SSH."""

from tpuops.transport.base import CmdResult, Transport, Worker

__all__ = ["CmdResult", "Transport", "Worker"]
