"""What an operator does to a store behind its back, for tests."""

from __future__ import annotations

import json
import os


def delete_topic_as_admin(store, topic: str) -> None:
    """Remove ``topic`` from config/topics.json, as a broker's admin tool would."""
    path = os.path.join(store.root, "config", "topics.json")
    with open(path) as f:
        data = json.load(f)
    del data["topicConfigTable"][topic]
    with open(path, "w") as f:
        json.dump(data, f)
    assert not store.has_topic(topic)
