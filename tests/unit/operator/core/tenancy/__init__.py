"""core/tenancy/: multi-tenancy's unit tests (RerankClass, admission policy, quotas); ``tenancy_helpers`` builds their
objects."""
