"""GPU suites (``python -m bench gpu|sweep|profile|check``) and the device-machine driver run.sh."""
