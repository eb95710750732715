"""tsm_ds.engine."""
