"""Prometheus metrics, the pure-ASGI middleware that feeds them, structured request logs."""
