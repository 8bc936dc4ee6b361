"""Shared fixtures: the anyio backend. Part-specific fixtures live in each test folder's conftest."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
