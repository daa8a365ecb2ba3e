"""kern-run."""
