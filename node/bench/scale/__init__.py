"""`symphony bench scale`: light daemons by the hundred, held against the simulator."""
