"""What the gateway tells its operators: structured logs, Prometheus metrics, OpenTelemetry tracing, and the
redaction that keeps secrets and content out of all three."""
