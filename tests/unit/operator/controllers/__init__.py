"""controllers/: the loops (reconcile, autoscaler, leader election, the queue, the Process) against fakes."""
