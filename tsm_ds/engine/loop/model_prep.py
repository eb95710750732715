"""The model around ``deepspeed.initialize``: channels_last inputs (``--channels-last``) and
``torch.compile`` through the engine (``--compile``).

Why not the usual recipes:

* ``model.to(memory_format=torch.channels_last)`` before ``deepspeed.initialize`` crashes in
  DeepSpeed's ``_broadcast_model`` (``p.data.view(torch.uint8)``: "self.stride(-1) must be 1 to view
  Float as Byte"), and re-formatting parameters *after* it silently stops training under the bf16
  optimizer and ZeRO, whose parameters are views of one flat buffer: a new storage is no longer
  the one the optimizer updates. So parameters stay contiguous (a model handed over in
  channels_last is made contiguous again before ``initialize``, and its inputs converted instead),
  and :func:`prepare_model` converts the *input clips*: each frame (3, H, W) of the (N, T, 3, H, W)
  clip is laid out channels-last, and the first convolution then produces channels_last
  activations, which every later convolution, BatchNorm and ReLU keep (oneDNN picks the layout
  from the input). The shifted convolutions keep it too (:mod:`tsm_ds.models.shift`).
* ``torch.compile(model)`` returns a wrapper whose ``state_dict`` keys start with ``_orig_mod.``:
  checkpoints and ``best_model.pt`` would carry them. DeepSpeed's ``engine.compile()`` compiles the
  module in place (``nn.Module.compile``), so the keys stay clean; a model the user compiled
  before handing it over is unwrapped here and compiled the same way (:func:`compile_engine`).
  Readers accept ``_orig_mod.`` keys anyway (:mod:`tsm_ds.engine.checkpoint.reader`).

Measured on this 2-core CPU (TSM-ResNet-18, 112 px; docs/performance.md, "Compute"): see the
table there; channels_last and compile are off by default.
"""
from __future__ import annotations

import logging
import sys
import time

import torch

__all__ = ["clip_to_channels_last", "prepare_model", "compile_engine", "is_channels_last", "has_batchnorm"]

log = logging.getLogger("tsm_ds.train")


def clip_to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """The same values laid out so that every frame is channels-last.

    Args:
        x: (N, T, C, H, W) clips or (M, C, H, W) frames, any dtype.

    Returns:
        ``x`` itself when already so laid out; else a copy whose (N*T, C, H, W) view (what the 2D
        backbone sees after ``reshape``) is ``torch.channels_last``: strides (T*H*W*C, H*W*C, 1,
        W*C, C) for 5-D input. Other ranks are returned unchanged.
    """
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if x.dim() != 5:
        return x
    n, t = x.shape[:2]
    frames = x.reshape(n * t, *x.shape[2:])
    if frames.is_contiguous(memory_format=torch.channels_last) and x.stride()[2] == 1:
        return x
    return frames.contiguous(memory_format=torch.channels_last).view(x.shape)


def is_channels_last(x: torch.Tensor) -> bool:
    """True for a 4-D tensor stored channels-last (and not also plainly contiguous: C or H*W is 1)."""
    return (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous())


def _channels_last_inputs(module, args, kwargs):
    if args and torch.is_tensor(args[0]):
        args = (clip_to_channels_last(args[0]),) + tuple(args[1:])
    return args, kwargs


def prepare_model(model: torch.nn.Module, *, channels_last: bool = False, compile: bool | str = False,
                  log: logging.Logger = log) -> tuple[torch.nn.Module, bool | str]:
    """Make ``model`` safe for ``deepspeed.initialize`` and set up ``--channels-last``; call before it.

    * A ``torch.compile`` wrapper (``OptimizedModule``) is unwrapped (its ``_orig_mod``): the
      engine compiles the module in place instead (:func:`compile_engine`), so that checkpoint
      keys carry no ``_orig_mod.``; the returned flag says to compile.
    * Parameters and buffers not stored contiguously (a model converted with
      ``.to(memory_format=torch.channels_last)``) are made contiguous (DeepSpeed broadcasts them
      as bytes); with such a model the inputs are converted instead, as with ``channels_last``.
    * ``channels_last``: a forward pre-hook lays out the model's first argument, the clips
      (N, T, 3, H, W), channels-last per frame (:func:`clip_to_channels_last`), in training and in
      evaluation. Values and parameter storage do not change.

    Args:
        model: the recognizer (N, T, 3, H, W) -> (N, K), or its ``torch.compile`` wrapper.
        channels_last: convert the inputs (``--channels-last``).
        compile: compile through the engine (``--compile``: True; or a ``torch.compile`` backend name).
        log: where the two conversions above are reported.

    Returns:
        (the model to hand to ``deepspeed.initialize``, the ``compile`` argument of
        :func:`compile_engine`: False, True or a backend name).
    """
    # torch.compile's wrapper class, if torch._dynamo was imported at all (importing it costs seconds)
    wrapper = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    if wrapper is not None and isinstance(model, wrapper):
        log.info("the model was wrapped by torch.compile: unwrapped, and compiled in place through "
                 "DeepSpeed's engine.compile() instead, so that checkpoint keys carry no '_orig_mod.'")
        model, compile = model._orig_mod, compile or True
    reformatted = 0
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if not t.is_contiguous():
                t.data = t.data.contiguous()   # before initialize: the engine's buffers are built after
                reformatted += 1
    if reformatted:
        log.info("%d parameters/buffers were not contiguous (a channels_last model): made contiguous before "
                 "deepspeed.initialize (its broadcast needs it); the input clips are converted to channels_last "
                 "instead", reformatted)
        channels_last = True
    if channels_last and not getattr(model, "_tsm_ds_channels_last", False):
        model.register_forward_pre_hook(_channels_last_inputs, with_kwargs=True)
        model._tsm_ds_channels_last = True
    return model, compile


def compile_engine(engine, compile: bool | str = True, log: logging.Logger = log) -> float:
    """``engine.compile()`` (DeepSpeed: ``torch.compile`` of the module in place, by default with the
    accelerator's backend: inductor on CPU and CUDA), after ``deepspeed.initialize``.

    Args:
        engine: the DeepSpeed engine.
        compile: True: the accelerator's backend; a string: that ``torch.compile`` backend
            (``"aot_eager"``: dynamo + AOTAutograd without code generation, for tests); False /
            None / "": nothing is done (returns 0).
        log: where the choice is reported.

    Compilation itself happens at the first forward / backward of each mode (training,
    evaluation) and batch shape; on CPU inductor needs a C++ compiler. The fused in-place shift
    is not traced: compiled models use the reference shift (:mod:`tsm_ds.models.shift`).

    Returns:
        seconds spent in ``engine.compile()`` itself (the graph compile comes later, lazily).

    Raises:
        RuntimeError: DeepSpeed says this torch cannot compile.
    """
    if not compile:
        return 0.0
    t0 = time.perf_counter()
    if isinstance(compile, str):
        engine.compile(backend=compile)
    else:
        engine.compile()
    took = time.perf_counter() - t0
    log.info("--compile: the module is compiled through DeepSpeed's engine.compile() (backend %s); the first "
             "training and the first evaluation batch each include the graph compile (minutes on CPU)",
             compile if isinstance(compile, str) else "the accelerator's default")
    return took


def has_batchnorm(model: torch.nn.Module) -> bool:
    """True when ``model`` has a BatchNorm layer (the bf16 recipes then need ``data_types.buffer_dtype``)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
