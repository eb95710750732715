"""tsm_ds: the Temporal Shift Module (Lin, Gan, Han) trained with DeepSpeed.

Data flow: video file -> tsm_ds.data (records, sampling, PyAV decode, transforms, dataset)
-> tsm_ds.models (TSM recognizer, (N, T, 3, H, W) -> logits (N, num_classes))
-> tsm_ds.engine (DeepSpeed engine, optimizers, checkpoints, evaluation, monitoring)
-> tsm_ds.bench (the paper's three bottlenecks and the scaling model).
"""

__version__ = "0.1.0"
