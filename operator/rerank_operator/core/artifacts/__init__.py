"""The artifact a model serves: its identity (a content hash), which one the pools serve and the Job to build it, and
sharing one artifact between tenants through a store."""
