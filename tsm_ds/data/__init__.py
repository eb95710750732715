"""tsm_ds.data."""
