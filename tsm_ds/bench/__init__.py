"""tsm_ds.bench."""
