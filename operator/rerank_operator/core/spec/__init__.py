"""The typed spec and how a RerankModel's spec is read: types and defaults, the parser, the field getters, the syntax
checks and quantities, the TEI flags a tenant may add."""
