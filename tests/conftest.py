"""Suite-wide pytest configuration. Keep it minimal: fixtures live in tests/<area>/conftest.py.

Django is configured by pytest-django from pyproject.toml (``DJANGO_SETTINGS_MODULE``, with
``platform/`` on ``pythonpath``).
"""
