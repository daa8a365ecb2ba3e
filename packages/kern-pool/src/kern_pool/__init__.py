"""kern-pool."""
