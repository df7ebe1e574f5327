"""The lab tests share the product tests' process settings (tests/conftest.py: SIGINT restored)."""

import tests.conftest  # noqa: F401
