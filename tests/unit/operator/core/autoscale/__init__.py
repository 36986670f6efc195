"""core/autoscale/: the autoscaler's pure core (the policy, its arithmetic, the split, scale to zero);
``autoscale_helpers`` builds their specs and signals."""
