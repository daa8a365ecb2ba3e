"""kern-manifest."""
