"""What every step may use: the Job's one error type (``errors``), its JSON logs (``logs``), the rule for reported
numbers (``results``) and the CPU it runs on (``isa``)."""
