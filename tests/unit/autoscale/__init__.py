"""The autoscaler's unit tests; ``autoscale_helpers`` builds their specs and signals."""
