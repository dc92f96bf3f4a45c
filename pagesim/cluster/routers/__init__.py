"""Routers: one small module each, one interface (pagesim.cluster.routers.base.Router)."""

from pagesim.cluster.routers.base import ROUTERS, ReplicaLoad, RoutedRequest, Router, make_router, register
from pagesim.cluster.routers import round_robin  # noqa: F401  (registers itself)

__all__ = ["ROUTERS", "ReplicaLoad", "RoutedRequest", "Router", "make_router", "register"]
