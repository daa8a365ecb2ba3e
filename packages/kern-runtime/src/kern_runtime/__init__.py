"""kern-runtime."""
