"""Whole-repository checks: linters and layers, the docs and module maps, the chart, alerts, dashboard, Argo CD health,
the version's copies, the operator's Dockerfile and the quantizer image's lock. ``operator_metrics_names`` reads the
operator's metric names for the alert and dashboard checks."""
