"""Checkpoint locations and table paths as keys (sink ids, pipeline ids, lock names)."""

from __future__ import annotations

import os


def location_key(where: str) -> str:
    """A checkpoint location or table path as one string however it is spelled.

    A local path is made absolute (``file:`` URIs too); other URIs (s3://,
    dbfs:/) are kept as given, less a trailing slash.
    """
    if where.startswith("file:"):
        where = "/" + where[len("file:") :].lstrip("/")
    if "://" in where or (":" in where.split("/", 1)[0] and not os.path.isabs(where)):
        return where.rstrip("/")
    return os.path.abspath(where)
