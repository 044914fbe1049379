"""Java classpaths for the interoperability tests, from ``./dev``'s jar directories only.

``./dev setup`` copies each set of Apache RocketMQ artifacts, with its runtime
dependencies, into a directory of its own under ``$ROCKETSPARK_JARS`` (default: the
checkout's ``.jars``): ``rocketmq`` (broker, client, tools, store 5.3.1) and
``rocketmq-namesrv`` (the NameServer, 5.3.3: 5.3.1 is not on Maven Central). A
classpath is every jar of one such directory and nothing else; never ``~/.m2``, whose
other RocketMQ versions and logging back-ends would load instead of these.
"""

from __future__ import annotations

import os
import shutil

import pytest

CHECKOUT_JARS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    ".jars",
)
ROCKETMQ = "rocketmq"
NAMESRV = "rocketmq-namesrv"
# JVM options for test programs whose stdout a test parses: RocketMQ's shaded logback
# reads this property (not logback.configurationFile).
QUIET = [
    "-Drmq.logback.configurationFile="
    + os.path.join(os.path.dirname(os.path.abspath(__file__)), "quiet-logback.xml")
]


def jar_dir(name: str) -> str | None:
    """Return ``./dev``'s directory of the artifact set ``name``, if it was fetched whole.

    ``$ROCKETSPARK_JARS/<name>`` first, then the checkout's ``.jars/<name>``; a directory
    counts only with the stamp ``./dev`` writes after a complete fetch.
    """
    roots = [os.environ.get("ROCKETSPARK_JARS"), CHECKOUT_JARS]
    for root in roots:
        if root and os.path.isfile(os.path.join(root, name, ".artifacts")):
            return os.path.join(root, name)
    return None


def classpath(name: str = ROCKETMQ) -> str | None:
    """Return the classpath of every jar in ``name``'s directory, or None without one."""
    d = jar_dir(name)
    if d is None:
        return None
    jars = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jar"))
    return os.pathsep.join(jars) if jars else None


def need_java(*names: str) -> list[str]:
    """Return the classpaths of ``names`` (default: RocketMQ's), skipping without a JDK.

    Under CI (``$CI`` set) a missing JDK or jar set fails the test instead: CI must run
    the interoperability tests, not skip them.
    """
    names = names or (ROCKETMQ,)
    paths = [classpath(n) for n in names]
    missing = [n for n, p in zip(names, paths, strict=True) if p is None]
    tools = [t for t in ("java", "javac") if not shutil.which(t)]
    if missing or tools:
        what = ", ".join(tools + [f"the jars of {n} (./dev setup fetches them)" for n in missing])
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing: CI must run the RocketMQ interoperability tests")
        pytest.skip(f"needs {what}")
    return [p for p in paths if p is not None]
