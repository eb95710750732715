"""Evaluation metrics and the results directory: top-1/top-5, mean class accuracy, confusion matrix.

Files written by :func:`write_eval_results` (each atomically: temporary file + ``os.replace``):

- ``metrics.json``: top-1, top-5, mean class accuracy (percent), per-class accuracy, the confusion
  matrix, protocol and checkpoint facts;
- ``metrics.csv``: the headline numbers, one ``metric,value`` row each;
- ``per_class.csv``: class, videos, correct, accuracy (percent);
- ``predictions.csv``: one row per video: index, path, label, predicted class, its score,
  whether top-1 / top-5 are right, the rank of the true class and the top-5 names;
- ``confusion.csv``: rows = true class, columns = predicted class, counts;
- ``confusion.png``: the row-normalised confusion matrix (matplotlib);
- ``scores.npz``: ``indices`` int64 (M,), ``scores`` float32 (M, K) (averaged logits or
  probabilities, per ``average``), ``labels`` int64 (M,), for ensembles and re-analysis.

Mean class accuracy follows the official ``test_models.py``: per-class recall (diagonal / row sum
of the confusion matrix) averaged over classes; classes with no test video are left out of the
mean (they have no recall), and are listed with ``videos = 0``.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tsm_ds.utils.io import atomic_write_bytes, atomic_write_text


def _csv_text(rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def confusion_matrix(labels: np.ndarray, preds: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts of (true class, predicted class) pairs.

    Args:
        labels: int (M,) true classes in [0, num_classes).
        preds: int (M,) predicted classes in [0, num_classes).
        num_classes: K.

    Returns:
        int64 (K, K): ``cm[i, j]`` = videos of class i predicted as j (rows true, columns predicted,
        as sklearn's ``confusion_matrix``).

    Raises:
        ValueError: different lengths, or a class outside [0, K).
    """
    labels, preds = np.asarray(labels, dtype=np.int64), np.asarray(preds, dtype=np.int64)
    if labels.shape != preds.shape or labels.ndim != 1:
        raise ValueError(f"labels {labels.shape} and preds {preds.shape} must be 1-D of equal length")
    for name, a in (("label", labels), ("prediction", preds)):
        if a.size and (a.min() < 0 or a.max() >= num_classes):
            raise ValueError(f"a {name} lies outside [0, {num_classes}): min {a.min()}, max {a.max()}; "
                             "check that the checkpoint's classes match the dataset's")
    return np.bincount(labels * num_classes + preds, minlength=num_classes * num_classes
                       ).reshape(num_classes, num_classes).astype(np.int64)


def per_class_accuracy(cm: np.ndarray) -> np.ndarray:
    """Recall of each class: ``cm[i, i] / cm[i].sum()``; float64 (K,), NaN for classes with no video."""
    cm = np.asarray(cm, dtype=np.float64)
    counts = cm.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, np.diag(cm) / np.where(counts > 0, counts, 1), np.nan)


def mean_class_accuracy(cm: np.ndarray) -> float:
    """Mean of :func:`per_class_accuracy` over classes with at least one video (a fraction in [0, 1]).

    Raises ValueError for an empty confusion matrix (no video at all).
    """
    acc = per_class_accuracy(cm)
    if np.isnan(acc).all():
        raise ValueError("mean class accuracy of an empty evaluation (no video counted)")
    return float(np.nanmean(acc))


def true_class_rank(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """0-based rank of the true class in each video's scores (0 = top-1 right).

    Args:
        scores: float (M, K). labels: int (M,).

    Returns:
        int64 (M,): number of classes scored strictly higher than the true class. Top-k is right
        iff rank < k (ties count in the video's favour, as ``torch.topk`` may order them either way).
    """
    scores, labels = np.asarray(scores), np.asarray(labels, dtype=np.int64)
    true = scores[np.arange(len(labels)), labels]
    return (scores > true[:, None]).sum(axis=1).astype(np.int64)


def summarize(scores: np.ndarray, labels: np.ndarray, *, ks: Sequence[int] = (1, 5)) -> dict[str, Any]:
    """Headline metrics of one evaluation.

    Args:
        scores: float (M, K) per-video scores (averaged logits or probabilities).
        labels: int (M,) true classes.
        ks: top-k accuracies to report; k larger than K is reported for k = K (always 100 %).

    Returns:
        ``{"videos": M, "num_classes": K, "top1": %, "top5": %, "mean_class_accuracy": %,
        "per_class_accuracy": [% or None], "confusion_matrix": (K, K) list}``; accuracies in percent.

    Raises:
        ValueError: empty input or inconsistent shapes.
    """
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    if scores.ndim != 2 or scores.shape[0] != labels.shape[0] or scores.shape[0] == 0:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape}: expected (M, K) and (M,), M >= 1")
    num_classes = scores.shape[1]
    rank = true_class_rank(scores, labels)
    cm = confusion_matrix(labels, scores.argmax(axis=1), num_classes)
    out: dict[str, Any] = {"videos": int(len(labels)), "num_classes": int(num_classes)}
    for k in ks:
        out[f"top{k}"] = 100.0 * float((rank < min(k, num_classes)).mean())
    out["mean_class_accuracy"] = 100.0 * mean_class_accuracy(cm)
    out["per_class_accuracy"] = [None if np.isnan(a) else 100.0 * float(a) for a in per_class_accuracy(cm)]
    out["confusion_matrix"] = cm.tolist()
    return out


def plot_confusion(cm: np.ndarray, class_names: Sequence[str], path: str | os.PathLike, *,
                   title: str = "Confusion matrix (row-normalised)") -> Path:
    """Save the row-normalised confusion matrix as a PNG (matplotlib, Agg backend), atomically.

    Cells show the fraction of each true class predicted as each class; counts are annotated
    when K <= 30. Beyond 60 classes tick labels are dropped (unreadable anyway).
    Returns the path.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cm = np.asarray(cm, dtype=np.float64)
    k = cm.shape[0]
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros_like(cm), where=rows > 0)
    size = min(4 + 0.35 * k, 40)
    fig, ax = plt.subplots(figsize=(size, size))
    try:
        im = ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        if k <= 60:
            ax.set_xticks(range(k), labels=list(class_names), rotation=90, fontsize=8)
            ax.set_yticks(range(k), labels=list(class_names), fontsize=8)
        if k <= 30:
            for i in range(k):
                for j in range(k):
                    if cm[i, j]:
                        ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=7,
                                color="white" if norm[i, j] > 0.5 else "black")
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def write_eval_results(out_dir: str | os.PathLike, *, scores: np.ndarray, labels: np.ndarray,
                       class_names: Sequence[str], paths: Sequence[str] | None = None,
                       indices: np.ndarray | None = None, average: str = "logits",
                       meta: dict[str, Any] | None = None, plot: bool = True,
                       data_lost: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the results directory (see the module docstring) and return the metrics.

    Args:
        out_dir: results directory (created when missing).
        scores: float (M, K) per-video scores in dataset order: averaged logits (``average="logits"``)
            or averaged probabilities (``"prob"``).
        labels: int (M,) true classes.
        class_names: K names; index i names class i.
        paths: M video paths for predictions.csv (None: empty column).
        indices: int (M,) dataset indices (None: 0..M-1).
        average: how the views were averaged; the ``score`` column is the softmax of averaged logits
            (``"logits"``) or the averaged probability (``"prob"``).
        meta: extra facts stored under ``"meta"`` in metrics.json (checkpoint, protocol, world size).
        data_lost: the unreadable videos left out (:func:`tsm_ds.data.bad_videos.loss_report`),
            stored as ``"data_lost"`` in metrics.json; None: not recorded.
        plot: write confusion.png.

    Returns:
        The metrics dict of :func:`summarize` plus ``"files"`` (name -> path) and ``"meta"``.

    Raises:
        ValueError: ``class_names`` does not have K entries, or ``paths`` not M; see :func:`summarize`.
    """
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    if len(class_names) != scores.shape[1]:
        raise ValueError(f"{len(class_names)} class names for {scores.shape[1]} model outputs")
    if paths is not None and len(paths) != len(labels):
        raise ValueError(f"{len(paths)} paths for {len(labels)} videos")
    indices = np.arange(len(labels)) if indices is None else np.asarray(indices, dtype=np.int64)
    out = Path(out_dir)
    metrics = summarize(scores, labels)
    metrics["average"] = average
    metrics["class_names"] = list(class_names)
    metrics["meta"] = dict(meta or {})
    if data_lost is not None:
        metrics["data_lost"] = data_lost
    cm = np.asarray(metrics["confusion_matrix"])
    files = {"metrics.json": out / "metrics.json", "metrics.csv": out / "metrics.csv",
             "per_class.csv": out / "per_class.csv", "predictions.csv": out / "predictions.csv",
             "confusion.csv": out / "confusion.csv"}

    atomic_write_text(files["metrics.csv"], _csv_text(
        [["metric", "value"]] + [[k, f"{metrics[k]:.4f}"] for k in ("top1", "top5", "mean_class_accuracy")]
        + [["videos", metrics["videos"]], ["num_classes", metrics["num_classes"]], ["average", average]]))

    counts = cm.sum(axis=1)
    atomic_write_text(files["per_class.csv"], _csv_text(
        [["class_index", "class", "videos", "correct", "accuracy"]]
        + [[i, name, int(counts[i]), int(cm[i, i]),
            "" if metrics["per_class_accuracy"][i] is None else f"{metrics['per_class_accuracy'][i]:.4f}"]
           for i, name in enumerate(class_names)]))

    probs = scores if average == "prob" else _softmax(scores)
    rank = true_class_rank(scores, labels)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    rows = [["index", "path", "label", "label_name", "pred", "pred_name", "score", "top1_correct",
             "top5_correct", "true_rank", "top5"]]
    for m in range(len(labels)):
        pred = int(order[m, 0])
        rows.append([int(indices[m]), "" if paths is None else str(paths[m]), int(labels[m]),
                     class_names[labels[m]], pred, class_names[pred], f"{probs[m, pred]:.6f}",
                     int(rank[m] < 1), int(rank[m] < min(5, scores.shape[1])), int(rank[m]) + 1,
                     "|".join(class_names[j] for j in order[m])])
    atomic_write_text(files["predictions.csv"], _csv_text(rows))

    buf = io.BytesIO()
    np.savez(buf, indices=indices, scores=scores.astype(np.float32), labels=labels)
    files["scores.npz"] = out / "scores.npz"
    atomic_write_bytes(files["scores.npz"], buf.getvalue())

    atomic_write_text(files["confusion.csv"], _csv_text(
        [["true\\predicted"] + list(class_names)] + [[name] + [int(v) for v in cm[i]]
                                                     for i, name in enumerate(class_names)]))
    if plot:
        files["confusion.png"] = plot_confusion(cm, class_names, out / "confusion.png")
    metrics["files"] = {k: str(v) for k, v in files.items()}
    atomic_write_text(files["metrics.json"], json.dumps(metrics, indent=2, default=str) + "\n")
    return metrics
