"""The official pulsar-client for the topic-list tests that drive one."""

from __future__ import annotations

import pytest


@pytest.fixture
def pulsar_client():
    """A factory of official clients (kit.official_client_factory): in this
    process, or through another interpreter that has pulsar-client (make
    test-pythons points 3.15 at its 3.14 venv).  Imported lazily: the kit
    needs the `topiclist` extra, which each module checks first."""
    from .kit import official_client_factory

    return official_client_factory()
