"""Shared fixtures: compiled kernels go to a session-wide temporary cache, never ~/.cache."""

import pytest


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """A directory for ``tc.build(..., cache_dir=kernel_cache)``, shared by the whole session."""
    return tmp_path_factory.mktemp("tilecraft_kernels")
