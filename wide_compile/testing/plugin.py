"""pytest plugin: ``pytest --wide-model PATH_OR_ID``."""
