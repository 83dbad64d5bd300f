"""Attribution graphs over transcoders (circuit-tracer's job, on our hook points, offline).

`AttributionGraph` holds a graph with circuit-tracer's fields and node order (see `graph.py`).
"""

from __future__ import annotations

from .attribute import attribute
from .graph import AttributionGraph, LogitTarget

__all__ = ["AttributionGraph", "LogitTarget", "attribute"]
