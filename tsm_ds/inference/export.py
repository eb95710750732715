"""Export a model to a ``torch.export`` program (.pt2) and ONNX, checked against PyTorch.

Two graphs can be exported:

- the clip model (default): input ``clip`` float32 (N, T, 3, H, W), normalised RGB, T =
  num_segments; output ``logits`` float32 (N, num_classes);
- the online (uni-directional) model's single step (``--online``): inputs ``frame`` float32
  (N, 3, H, W) and ``cache_in_0 .. cache_in_{B-1}``, one per shifted block (the past frame's
  shifted channels); outputs ``logits`` (N, num_classes) and ``cache_out_0 .. cache_out_{B-1}``,
  which the caller feeds back as the next step's caches. The first frame takes zero caches
  (``export.json`` lists their shapes). This is how the official online demo exports
  (``online_demo/main.py``: ``torch.onnx.export`` of ``(frame, *buffers)``), here from
  ``model.step`` rather than a hand-written MobileNet.

The batch dimension N is dynamic unless ``--static-batch``. TorchScript is not used (torch
deprecates ``jit.script`` and ``jit.trace``); ONNX goes through ``torch.onnx.export(dynamo=True)``
from the same ``torch.export`` program, so both files hold one graph. ONNX needs the ``export``
extra (``pip install tsm_ds[export]``: onnx, onnxscript; onnxruntime for the check).

Check: after writing, each file is loaded back and run on fresh random inputs (a batch size other
than the example's when N is dynamic; for the online step, non-zero caches from a first step).
For every output, the largest absolute difference to the PyTorch model must stay within
``atol + rtol * max|reference output|`` (defaults 1e-4 and 1e-5), else the command fails (exit
status 1). The tolerance scales with each output's largest magnitude, not element by element:
float32 rounding in a convolution grows with the size of the activations it sums, and the online
caches are raw activations (up to ~100 in ResNet-50) next to small logits. Measured (CPU,
ResNet-50, T=8, 224 px, random weights): .pt2 bit-identical; ONNX Runtime 1.32 max |diff| 1.4e-6
(clip model, 2.7e-7 of the largest logit) and 1.8e-4 (online step incl. caches, 1.5e-6 of the
largest cache value). The figures go to ``export.json``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from tsm_ds.utils.io import atomic_path, atomic_write_text

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-5


class OnlineStep(nn.Module):
    """One online-TSM step with the shift caches as explicit tensors: ``(frame, *caches) -> (logits, *caches)``.

    Args:
        model: a model built with ``shift="online"`` that has
            ``step(frame (N, 3, H, W), cache or None) -> (logits (N, K), cache)``.
        cache_spec: the pytree structure of ``step``'s cache (from :func:`initial_caches`).

    Forward:
        frame: float32 (N, 3, H, W); caches: B float32 tensors laid out as :func:`initial_caches`.
        Returns (logits (N, K), B new caches of the same shapes).
    """

    def __init__(self, model: nn.Module, cache_spec: pytree.TreeSpec):
        super().__init__()
        self.model = model
        self.cache_spec = cache_spec

    def forward(self, frame: torch.Tensor, *caches: torch.Tensor):
        cache = pytree.tree_unflatten(list(caches), self.cache_spec)
        logits, new_cache = self.model.step(frame, cache)
        return (logits, *pytree.tree_leaves(new_cache))


def initial_caches(model: nn.Module, frame: torch.Tensor) -> tuple[list[torch.Tensor], pytree.TreeSpec]:
    """The zero caches a stream starts from, flattened, and their pytree structure.

    Runs ``model.step(frame, None)`` once to learn the cache layout, then returns zeros of the
    same shapes (a stream's first frame sees zeros from the past: the official online shift).

    Args:
        model: online model with ``step``. frame: float32 (N, 3, H, W).

    Returns:
        (list of B float tensors, one per shifted block, e.g. (N, fold, H', W'); the TreeSpec).

    Raises:
        TypeError: the model has no ``step`` or its cache holds something other than tensors.
    """
    if not callable(getattr(model, "step", None)):
        raise TypeError("--online needs a model built with shift='online' (it has no step() method)")
    with torch.no_grad():
        _, cache = model.step(frame, None)
    leaves, spec = pytree.tree_flatten(cache)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise TypeError(f"model.step returned a cache of {type(cache).__name__} whose leaves are not all "
                        "tensors; it cannot be exported as explicit inputs")
    return [torch.zeros_like(t) for t in leaves], spec


def batch_dynamic_shapes(num_inputs: int, *, varargs: bool = False):
    """``dynamic_shapes`` making dim 0 of every input one symbolic size ``batch`` in [1, 4096].

    ``varargs``: the module is ``forward(first, *rest)`` (:class:`OnlineStep`), whose extra inputs
    torch.export groups into one tuple.
    """
    batch = torch.export.Dim("batch", min=1, max=4096)
    if varargs:
        return ({0: batch}, tuple({0: batch} for _ in range(num_inputs - 1)))
    return tuple({0: batch} for _ in range(num_inputs))


def export_program(module: nn.Module, inputs: Sequence[torch.Tensor], path: str | os.PathLike, *,
                   dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """``torch.export.export`` the module and save it (atomically) with ``torch.export.save``.

    Args:
        module: eval-mode module; ``module(*inputs)`` returns a tensor or a tuple of tensors.
        inputs: example tensors; their shapes fix every dimension not made dynamic.
        path: the .pt2 file.
        dynamic_shapes: as ``torch.export.export`` (e.g. :func:`batch_dynamic_shapes`); None: static.

    Returns:
        The ExportedProgram (``.module()`` runs it).

    Raises:
        torch._dynamo.exc.UserError and friends when the model cannot be exported (e.g. data-
        dependent control flow, or a dimension marked dynamic that the code specialises); the
        message names the offending line.
    """
    module.eval()
    program = torch.export.export(module, tuple(inputs), dynamic_shapes=dynamic_shapes)
    path = Path(path)
    with atomic_path(path, suffix=path.suffix) as tmp:   # torch.export.save checks for ".pt2"
        torch.export.save(program, tmp)
    return program


def export_onnx(program: torch.export.ExportedProgram, path: str | os.PathLike, *,
                input_names: Sequence[str], output_names: Sequence[str],
                metadata: dict[str, str] | None = None, opset: int | None = None) -> Path:
    """Translate an ExportedProgram to ONNX (``torch.onnx.export(dynamo=True)``) and save it atomically.

    Args:
        program: from :func:`export_program` (dynamic dims carry over as symbolic ONNX dims).
        path: the .onnx file (weights inside the file: our models are far below ONNX's 2 GB limit).
        input_names / output_names: graph input / output names.
        metadata: string key/values stored in the model's ``metadata_props`` (class names, config).
        opset: ONNX opset (None: the exporter's default).

    Returns:
        The path.

    Raises:
        ImportError: onnx / onnxscript are not installed (the ``export`` extra).
    """
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ImportError("ONNX export needs the onnx and onnxscript packages: "
                          "pip install 'tsm_ds[export]' (or pip install onnx onnxscript)") from e
    onnx_program = torch.onnx.export(program, (), input_names=list(input_names),
                                     output_names=list(output_names), opset_version=opset,
                                     dynamo=True, verbose=False)
    if metadata:  # onnx_ir model: what ONNXProgram.save serialises
        onnx_program.model.metadata_props.update({str(k): str(v) for k, v in metadata.items()})
    path = Path(path)
    with atomic_path(path, suffix=path.suffix) as tmp:
        onnx_program.save(tmp, external_data=False)
    return path


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def compare(reference: Sequence[torch.Tensor], candidate: Sequence[Any], *, atol: float, rtol: float
            ) -> dict[str, Any]:
    """Largest differences between reference outputs and a candidate's (tensors or numpy arrays).

    Returns ``{"max_abs_diff": float, "max_rel_diff": float (max |diff| / max |ref|, worst output),
    "ok": every output has max |diff| <= atol + rtol * max |ref|, "atol", "rtol",
    "max_abs_diff_per_output": [float] in output order}``.

    Raises ValueError: different numbers of outputs or shapes.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"{len(candidate)} outputs, expected {len(reference)}")
    max_abs = max_rel = 0.0
    ok = True
    per_output = []
    for ref, got in zip(reference, candidate):
        got = torch.as_tensor(got).to(torch.float64)
        ref = ref.detach().to(torch.float64)
        if got.shape != ref.shape:
            raise ValueError(f"output shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
        if ref.numel() == 0:
            per_output.append(0.0)
            continue
        diff = (got - ref).abs()
        per_output.append(float(diff.max()))
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(diff.max() / ref.abs().max().clamp_min(1e-12)))
        ok = ok and float(diff.max()) <= atol + rtol * float(ref.abs().max())
    return {"max_abs_diff": max_abs, "max_rel_diff": max_rel, "ok": ok, "atol": atol, "rtol": rtol,
            "max_abs_diff_per_output": per_output}


def check_onnx(path: str | os.PathLike, inputs: Sequence[torch.Tensor], input_names: Sequence[str]
               ) -> list | None:
    """Run the ONNX file with onnxruntime (CPU); None when onnxruntime is not installed.

    Returns the list of output arrays (numpy) in graph order.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: t.detach().cpu().numpy() for name, t in zip(input_names, inputs)}
    return session.run(None, feeds)


def export_model(model: nn.Module, out_dir: str | os.PathLike, *, num_segments: int, img_size: int = 224,
                 batch_size: int = 1, online: bool = False, formats: Sequence[str] = ("pt2", "onnx"),
                 dynamic_batch: bool = True, name: str = "model", atol: float = DEFAULT_ATOL,
                 rtol: float = DEFAULT_RTOL, opset: int | None = None, seed: int = 0,
                 metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Export ``model`` to ``out_dir/{name}.pt2`` and/or ``{name}.onnx``, verify, write ``export.json``.

    Args:
        model: a TSM recognizer (float32 (N, T, 3, H, W) -> logits (N, K)); with ``online`` it
            must have ``step`` (``shift="online"``).
        out_dir: output directory (created).
        num_segments: T of the exported clip input (fixed in the graph).
        img_size: H = W of the input, pixels.
        batch_size: N of the example input (at least 2 when ``dynamic_batch``: torch.export
            specialises a dimension whose example size is 1).
        online: export :class:`OnlineStep` (frame + caches) instead of the clip model.
        formats: any of ``"pt2"``, ``"onnx"``.
        dynamic_batch: keep N symbolic.
        name: file stem.
        atol, rtol: tolerance of the check: max |diff| <= atol + rtol * max |reference| per output.
        opset: ONNX opset (None: exporter default).
        seed: seed of the random example and check inputs.
        metadata: JSON-able facts stored in export.json and the ONNX metadata (class names, config).

    Returns:
        The export.json payload: files, input/output names and shapes, per-format check results
        (``max_abs_diff``, ``max_rel_diff``, ``ok``; ``"onnxruntime": "not installed"`` when absent).

    Raises:
        ValueError: unknown format. TypeError: ``online`` without ``step``. ImportError: ONNX asked
        for without the export extra. Export errors from torch.export / torch.onnx.
    """
    bad = set(formats) - {"pt2", "onnx"}
    if bad or not formats:
        raise ValueError(f"formats {sorted(bad) or formats}: choose from pt2, onnx")
    model = model.eval().float()
    if dynamic_batch and batch_size < 2:
        batch_size = 2  # torch.export specialises sizes 0 and 1: a dynamic dim needs an example >= 2
    gen = torch.Generator().manual_seed(seed)
    n_check = batch_size + 1 if dynamic_batch else batch_size

    if online:
        frame = torch.randn(batch_size, 3, img_size, img_size, generator=gen)
        caches, spec = initial_caches(model, frame)
        module = OnlineStep(model, spec).eval()
        example = [frame, *caches]
        input_names = ["frame"] + [f"cache_in_{i}" for i in range(len(caches))]
        output_names = ["logits"] + [f"cache_out_{i}" for i in range(len(caches))]
        # the check feeds real (non-zero) caches: one step from zeros, then a second frame
        frame_c = torch.randn(n_check, 3, img_size, img_size, generator=gen)
        zero_c, _ = initial_caches(model, frame_c)
        with torch.no_grad():
            warm = _as_tuple(module(frame_c, *zero_c))[1:]
        check_inputs = [torch.randn(n_check, 3, img_size, img_size, generator=gen), *warm]
    else:
        module = model
        example = [torch.randn(batch_size, num_segments, 3, img_size, img_size, generator=gen)]
        input_names, output_names = ["clip"], ["logits"]
        check_inputs = [torch.randn(n_check, num_segments, 3, img_size, img_size, generator=gen)]

    with torch.no_grad():
        reference = _as_tuple(module(*check_inputs))
        example_out = _as_tuple(module(*example))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(metadata or {})
    report: dict[str, Any] = {
        "online": online, "num_segments": num_segments, "img_size": img_size,
        "dynamic_batch": dynamic_batch, "example_batch_size": batch_size, "check_batch_size": n_check,
        "inputs": {n: list(t.shape) for n, t in zip(input_names, example)},
        "outputs": {n: list(t.shape) for n, t in zip(output_names, example_out)},
        "layout": ("frame (N, 3, H, W) + caches -> logits (N, K) + caches" if online
                   else "clip (N, T, 3, H, W), normalised RGB -> logits (N, K)"),
        "torch": torch.__version__, "files": {}, "check": {}, "meta": meta,
    }
    with torch.no_grad():
        shapes = batch_dynamic_shapes(len(example), varargs=online) if dynamic_batch else None
        program = export_program(module, example, out / f"{name}.pt2", dynamic_shapes=shapes)
    report["files"]["pt2"] = str(out / f"{name}.pt2") if "pt2" in formats else None
    if "pt2" in formats:
        loaded = torch.export.load(out / f"{name}.pt2").module()
        with torch.no_grad():
            report["check"]["pt2"] = compare(reference, _as_tuple(loaded(*check_inputs)), atol=atol, rtol=rtol)
    else:
        os.unlink(out / f"{name}.pt2")
        report["files"].pop("pt2")
    if "onnx" in formats:
        onnx_meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
        onnx_meta["tsm_ds.layout"] = report["layout"]
        path = export_onnx(program, out / f"{name}.onnx", input_names=input_names,
                           output_names=output_names, metadata=onnx_meta, opset=opset)
        report["files"]["onnx"] = str(path)
        outputs = check_onnx(path, check_inputs, input_names)
        if outputs is None:
            report["check"]["onnx"] = {"onnxruntime": "not installed: the ONNX file was not run"}
        else:
            import onnxruntime
            report["check"]["onnx"] = {**compare(reference, outputs, atol=atol, rtol=rtol),
                                       "onnxruntime": onnxruntime.__version__}
    report["ok"] = all(c.get("ok", True) for c in report["check"].values())
    atomic_write_text(out / "export.json", json.dumps(report, indent=2, default=str) + "\n")
    return report
