"""A run's life: launch (validate, plan, execute), target, store, follow, scan, report, recover, bench."""
