"""One reconcile's data: what it observed, the plan it computes, whether a live child drifted, what executing the plan
did."""
