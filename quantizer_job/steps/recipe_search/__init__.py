"""Which INT8 model to make: the recipes (``recipes``, plain data) and the search that chooses among tried ones
(``search``, a pure function). Neither imports the ML stack (an import-linter contract)."""
