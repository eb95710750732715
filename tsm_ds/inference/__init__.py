"""tsm_ds.inference: what a trained model is used for (the library halves of eval / predict / export).

- :mod:`.loading`: any checkpoint (our export, a DeepSpeed run dir, an official ``.pth``) as an
  eval-mode model with its class names and config.
- :mod:`.views`: the official test protocols (clips x crops) and view averaging.
- :mod:`.evaluate`: multi-view evaluation on one process or many; :mod:`.eval_report`: metrics and files.
- :mod:`.predict`: top-k classes of a video, by the test protocol or streaming (online TSM).
- :mod:`.export`: ``torch.export`` and ONNX, checked against PyTorch.

The trainer's distributed evaluation (``gather_predictions``, BN sync, top-k) is in
:mod:`tsm_ds.engine.loop.evaluate`: the trainer uses it, and the engine layer sits below this one.
"""
