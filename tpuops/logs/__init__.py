"""Reading worker logs, below sop/ (the executor follows with it): follow, scanner (the one regex table), events."""
